"""Every refusal in the one error shape, with the right status, from the real app (fake Triton)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gateway import errors
from tests.unit.conftest import UnitGateway


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, str]:
    """``response`` is the one error shape with ``status`` and ``code``, and names its request."""
    assert response.status_code == status, response.text
    error: dict[str, str] = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    assert error["request_id"] == response.headers["x-request-id"]
    return error


async def test_missing_key_is_401_with_a_challenge(gateway: UnitGateway) -> None:
    response = await gateway.client.post("/v1/predict", json={"texts": ["hi"]})
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "headers",
    [
        {"X-API-Key": "not-a-key"},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": "Basic x"},
    ],
)
async def test_invalid_key_is_401_and_never_echoed(
    gateway: UnitGateway, headers: dict[str, str]
) -> None:
    response = await gateway.client.post("/v1/predict", json={"texts": ["hi"]}, headers=headers)
    assert_error(response, 401, "unauthorized")
    assert "not-a-key" not in response.text


async def test_bearer_and_x_api_key_both_work(gateway: UnitGateway) -> None:
    for headers in (
        {"X-API-Key": gateway.infer_key},
        {"Authorization": f"Bearer {gateway.infer_key}"},
    ):
        response = await gateway.client.post("/v1/predict", json={"texts": ["hi"]}, headers=headers)
        assert response.status_code == 200, response.text


async def test_key_without_the_infer_scope_is_403(gateway: UnitGateway) -> None:
    for route in ("/v1/predict", "/v1/embed"):
        response = await gateway.client.post(
            route, json={"texts": ["hi"]}, headers={"X-API-Key": gateway.admin_only_key}
        )
        assert_error(response, 403, "forbidden")
    response = await gateway.client.get("/v1/models", headers={"X-API-Key": gateway.admin_only_key})
    assert_error(response, 403, "forbidden")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "bad_request"),
        (b'{"texts": []}', 422, "invalid_request"),
        (b'{"texts": ["fine", "  "]}', 422, "invalid_request"),
        (b'{"texts": ["ok"], "extra": 1}', 422, "invalid_request"),
        (b'{"texts": ["ok"], "model_version": "0"}', 422, "invalid_request"),
        (b'{"texts": ["' + b"x" * 101 + b'"]}', 422, "invalid_request"),
        (b'{"texts": [' + b",".join([b'"a"'] * 65) + b"]}", 422, "invalid_request"),
        (b'{"texts": ["' + b"x" * 5000 + b'"]}', 413, "payload_too_large"),
    ],
)
async def test_bad_bodies_get_their_status(
    gateway: UnitGateway, body: bytes, status: int, code: str
) -> None:
    response = await gateway.client.post(
        "/v1/predict",
        content=body,
        headers={**gateway.auth, "content-type": "application/json"},
    )
    assert_error(response, status, code)
    assert not gateway.triton.infer_calls()


async def test_a_chunked_body_over_the_limit_is_refused_before_it_is_read_whole(
    gateway: UnitGateway,
) -> None:
    chunks_sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal chunks_sent
        for _ in range(100):
            chunks_sent += 1
            yield b"x" * 1024

    response = await gateway.client.post("/v1/predict", content=chunks(), headers=gateway.auth)
    assert_error(response, 413, "payload_too_large")
    assert chunks_sent < 100


@pytest.mark.parametrize(
    "value",
    [
        "0", "-0", "-1", "abc", "", "0x10", "nan", "NaN", "inf", "-inf", "Infinity",
        # Too short to be met: 504 for certain, so refused as a mistake (5e-324 was found fuzzing).
        "5e-324", "0.0009", "1e-400",
        # Not JSON numbers, though float() reads them.
        "1_0", "+1", ".5", "1.",
    ],
)  # fmt: skip
async def test_unusable_request_timeout_is_422(gateway: UnitGateway, value: str) -> None:
    response = await gateway.client.post(
        "/v1/predict",
        json={"texts": ["hi"]},
        headers={**gateway.auth, "X-Request-Timeout": value},
    )
    error = assert_error(response, 422, "invalid_request")
    assert "X-Request-Timeout" in error["message"]
    assert not gateway.triton.infer_calls()


async def test_request_timeout_only_shortens_the_deadline(gateway: UnitGateway) -> None:
    configured = gateway.settings.request_timeout_s
    for asked, expected in (
        ("0.5", 0.5),
        ("0.001", 0.001),  # the documented minimum
        ("2E-1", 0.2),
        ("999", configured),
        ("1e400", configured),  # a valid numeral past float range is just a long deadline
    ):
        response = await gateway.client.post(
            "/v1/predict",
            json={"texts": ["hi"]},
            headers={**gateway.auth, "X-Request-Timeout": asked},
        )
        assert response.status_code == 200
        # Triton gets what is left of the deadline when the request reaches it.
        sent = gateway.triton.infer_calls()[-1].timeout_s
        assert sent is not None and expected - 0.5 < sent <= expected


async def test_unknown_route_and_method(gateway: UnitGateway) -> None:
    assert_error(await gateway.client.get("/v1/nothing-here"), 404, "not_found")
    assert_error(
        await gateway.client.get("/v1/predict", headers=gateway.auth), 405, "method_not_allowed"
    )


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/predict", {"POST"}),
        ("OPTIONS", "/v1/embed", {"POST"}),
        ("DELETE", "/v1/models", {"GET"}),
        ("POST", "/livez", {"GET"}),
        ("PUT", "/openapi.json", {"GET", "HEAD"}),
        ("POST", "/docs/static/swagger-ui.css", {"GET", "HEAD"}),
    ],
)
async def test_method_not_allowed_names_the_methods_the_path_has(
    gateway: UnitGateway, method: str, path: str, allowed: set[str]
) -> None:
    response = await gateway.client.request(method, path, headers=gateway.auth)
    error = assert_error(response, 405, "method_not_allowed")
    assert {name.strip() for name in response.headers["allow"].split(",")} == allowed
    assert method in error["message"]


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (errors.UpstreamUnavailable("Triton: gone", 3), 503, "upstream_unavailable"),
        (errors.UpstreamTimeout("Triton: too slow"), 504, "upstream_timeout"),
        (errors.UpstreamInvalidArgument("Triton: bad input"), 422, "upstream_invalid_argument"),
        (errors.ModelNotFound("Triton: no version 7"), 404, "model_not_found"),
        (errors.UpstreamError("Triton: internal"), 502, "upstream_error"),
    ],
)
async def test_triton_failures_keep_their_status(
    gateway: UnitGateway, failure: errors.GatewayError, status: int, code: str
) -> None:
    gateway.triton.failure = failure
    response = await gateway.client.post("/v1/embed", json={"texts": ["hi"]}, headers=gateway.auth)
    assert_error(response, status, code)
    if status == 503:
        assert response.headers["retry-after"] == "3"


async def test_an_unexpected_exception_is_a_500_with_the_request_id(gateway: UnitGateway) -> None:
    gateway.triton.failure = RuntimeError("a bug")
    response = await gateway.client.post(
        "/v1/predict", json={"texts": ["hi"]}, headers={**gateway.auth, "X-Request-ID": "trace-1"}
    )
    error = assert_error(response, 500, "internal_error")
    assert error["request_id"] == "trace-1"
    assert "a bug" not in response.text
