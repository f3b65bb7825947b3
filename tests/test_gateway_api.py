"""The gateway's API against a real Triton: auth, validation, errors, results, metrics, ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from build_models.pipeline import ReferencePipeline
from tests.conftest import TEXTS
from tests.gateway_support import RunningGateway


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, str] = body["error"]
    assert set(error) == {"code", "message", "request_id"}
    assert error["code"] == code
    assert error["message"]
    assert error["request_id"] == response.headers["x-request-id"]
    return error


@pytest.fixture(scope="module")
def reference(built_repository: Path) -> ReferencePipeline:
    return ReferencePipeline(built_repository)


# --- results ---------------------------------------------------------------------------------


def test_predict_returns_reference_scores_in_order(
    gateway: RunningGateway, reference: ReferencePipeline
) -> None:
    with gateway.client() as client:
        response = client.post("/v1/predict", json={"texts": TEXTS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_name"] == "text_regression" and body["model_version"] == "1"
    assert body["request_id"] == response.headers["x-request-id"]
    np.testing.assert_allclose(body["scores"], reference.score(TEXTS), atol=1e-4)
    reversed_scores = client_scores(gateway, TEXTS[::-1])
    np.testing.assert_allclose(reversed_scores, body["scores"][::-1], atol=1e-6)


def client_scores(gateway: RunningGateway, texts: list[str]) -> list[float]:
    with gateway.client() as client:
        response = client.post("/v1/predict", json={"texts": texts})
    assert response.status_code == 200, response.text
    scores: list[float] = response.json()["scores"]
    return scores


def test_embed_returns_reference_embeddings(
    gateway: RunningGateway, reference: ReferencePipeline
) -> None:
    with gateway.client() as client:
        response = client.post("/v1/embed", json={"texts": TEXTS, "model_version": "1"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_name"] == "text_embedding" and body["dimension"] == 384
    np.testing.assert_allclose(np.array(body["embeddings"]), reference.embed(TEXTS), atol=1e-4)


def test_models_lists_triton_models_and_routes(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        body = client.get("/v1/models").json()
    assert body["routes"] == {"/v1/predict": "text_regression", "/v1/embed": "text_embedding"}
    states = {(m["name"], m["version"]): m["state"] for m in body["models"]}
    for name in ("preprocess", "bert", "forest", "text_regression", "text_embedding"):
        assert states[(f"{name}_v1", "1")] == "READY"


def test_unknown_model_version_is_404(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        response = client.post("/v1/predict", json={"texts": ["hi"], "model_version": "7"})
    assert_error(response, 404, "model_not_found")


# --- auth ------------------------------------------------------------------------------------


def test_missing_key_is_401_with_challenge(gateway: RunningGateway) -> None:
    with gateway.client(key=None) as client:
        response = client.post("/v1/predict", json={"texts": ["hi"]})
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "headers",
    [
        {"X-API-Key": "not-a-key"},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": "Basic abc"},
    ],
)
def test_invalid_key_is_401(gateway: RunningGateway, headers: dict[str, str]) -> None:
    with gateway.client(key=None, headers=headers) as client:
        response = client.post("/v1/predict", json={"texts": ["hi"]})
    assert_error(response, 401, "unauthorized")
    assert "not-a-key" not in response.text


def test_both_header_forms_are_accepted(gateway: RunningGateway) -> None:
    for headers in (
        {"X-API-Key": gateway.infer_key},
        {"Authorization": f"Bearer {gateway.infer_key}"},
    ):
        with gateway.client(key=None, headers=headers) as client:
            assert client.post("/v1/predict", json={"texts": ["hi"]}).status_code == 200


def test_key_without_infer_scope_is_403(gateway: RunningGateway) -> None:
    with gateway.client(key=None, headers={"X-API-Key": gateway.admin_only_key}) as client:
        response = client.post("/v1/embed", json={"texts": ["hi"]})
    assert_error(response, 403, "forbidden")


def test_health_routes_are_open(gateway: RunningGateway) -> None:
    with gateway.client(key=None) as client:
        assert client.get("/livez").json() == {"status": "alive", "reason": None}
        assert client.get("/readyz").status_code == 200
        assert client.get("/metrics").status_code == 200


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"texts": []}, "texts"),
        ({"texts": ["fine", "   "]}, "whitespace"),
        ({"texts": [""]}, "whitespace"),
        ({"texts": "not a list"}, "texts"),
        ({"texts": [1, 2]}, "texts"),
        ({}, "texts"),
        ({"texts": ["hi"], "temperature": 1}, "temperature"),
        ({"texts": ["hi"], "model_version": "latest"}, "model_version"),
        ({"texts": ["hi"], "model_version": "0"}, "model_version"),
        ({"texts": ["word"] * 65}, "limit is 64"),
        ({"texts": ["x" * 2001]}, "longer than 2000"),
    ],
)
def test_invalid_bodies_are_422(gateway: RunningGateway, body: object, fragment: str) -> None:
    with gateway.client() as client:
        response = client.post("/v1/predict", json=body)
    error = assert_error(response, 422, "invalid_request")
    assert fragment in error["message"]


def test_invalid_json_and_utf8_are_400(gateway: RunningGateway) -> None:
    with gateway.client(headers={"content-type": "application/json"}) as client:
        assert_error(client.post("/v1/predict", content=b'{"texts": ["a"'), 400, "bad_request")
        assert_error(
            client.post("/v1/predict", content=b'{"texts": ["\xff\xfe"]}'), 400, "bad_request"
        )


def test_body_over_the_limit_is_413_before_parsing(gateway: RunningGateway) -> None:
    big = {"texts": ["y" * 1000] * 70}  # > 64 KiB
    with gateway.client() as client:
        assert_error(client.post("/v1/predict", json=big), 413, "payload_too_large")

        def chunks() -> Iterator[bytes]:
            yield b'{"texts": ['
            for _ in range(100):
                yield b'"' + b"z" * 1000 + b'",'
            yield b'"end"]}'

        chunked = client.post(
            "/v1/predict", content=chunks(), headers={"content-type": "application/json"}
        )
    assert_error(chunked, 413, "payload_too_large")


def test_unknown_route_and_wrong_method_use_the_error_shape(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        assert_error(client.get("/v1/nothing"), 404, "not_found")
        assert_error(client.get("/v1/predict"), 405, "method_not_allowed")


# --- deadlines, ids, timing, metrics -------------------------------------------------------------


def test_deadline_exceeded_is_504(gateway: RunningGateway) -> None:
    with gateway.client(headers={"X-Request-Timeout": "0.001"}) as client:
        response = client.post("/v1/predict", json={"texts": ["a long review " * 50] * 32})
    assert_error(response, 504, "upstream_timeout")


def test_request_timeout_header_must_be_positive(gateway: RunningGateway) -> None:
    with gateway.client(headers={"X-Request-Timeout": "-1"}) as client:
        assert_error(client.post("/v1/predict", json={"texts": ["a"]}), 422, "invalid_request")


def test_request_id_is_taken_echoed_and_generated(gateway: RunningGateway) -> None:
    with gateway.client(headers={"X-Request-ID": "caller-id-42"}) as client:
        ok = client.post("/v1/predict", json={"texts": ["a"]})
        failed = client.post("/v1/predict", json={"texts": []})
    assert (
        ok.headers["x-request-id"] == "caller-id-42" and ok.json()["request_id"] == "caller-id-42"
    )
    assert failed.json()["error"]["request_id"] == "caller-id-42"
    with gateway.client() as client:
        generated = client.post("/v1/predict", json={"texts": ["a"]}).headers["x-request-id"]
    assert len(generated) == 32 and generated != "caller-id-42"


def test_server_timing_splits_gateway_and_triton(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        header = client.post("/v1/predict", json={"texts": ["a"]}).headers["server-timing"]
    parts = dict(part.strip().split(";dur=") for part in header.split(","))
    assert set(parts) == {"gateway", "triton"}
    assert float(parts["triton"]) > 0 and float(parts["gateway"]) >= 0


def test_metrics_expose_custom_series(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        client.post("/v1/predict", json={"texts": ["a", "b"]})
        client.post("/v1/predict", json={"texts": ["a"], "model_version": "9"})
        text = client.get("/metrics").text
    assert (
        'gateway_triton_request_duration_seconds_bucket{le="0.01",model="text_regression_v1",transport="grpc"}'
        in text
    )
    assert 'gateway_texts_per_request_count{route="predict"}' in text
    assert (
        'gateway_version_requests_total{model="text_regression",outcome="ok",role="stable",version="1"}'
        in text
    )
    assert "gateway_requests_in_flight " in text
    assert "gateway_ready 1.0" in text
    assert 'http_requests_total{handler="/v1/predict",method="POST",status="200"}' in text
    assert 'handler="/readyz"' not in text
