"""The service over a fake Triton: splitting above max_batch_size, order, all or nothing."""

from __future__ import annotations

import asyncio

import numpy as np

from gateway import errors
from gateway.openapi import error_responses
from tests.unit.conftest import UnitGateway, unit_gateway
from tests.unit.fake_triton import FakeTriton


async def test_requests_above_max_batch_size_are_split_and_reassembled_in_order(
    gateway: UnitGateway,
) -> None:
    texts = [f"text {'x' * i}" for i in range(20)]  # batch limit 8: chunks of 8, 8, 4
    response = await gateway.client.post(
        "/v1/predict", json={"texts": texts}, headers={**gateway.auth, "X-Request-ID": "req-1"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["scores"] == [float(len(text)) for text in texts]
    calls = gateway.triton.infer_calls()
    assert [len(call.texts) for call in calls] == [8, 8, 4]
    assert [call.request_id for call in calls] == ["req-1/0", "req-1/1", "req-1/2"]

    response = await gateway.client.post("/v1/embed", json={"texts": texts}, headers=gateway.auth)
    embeddings = np.array(response.json()["embeddings"])
    assert embeddings.shape == (20, 2)
    assert list(embeddings[:, 0]) == [len(text) for text in texts]
    assert list(embeddings[:, 1]) == [i % 8 for i in range(20)]  # each chunk's own rows


async def test_one_failed_chunk_fails_the_request_and_cancels_the_others() -> None:
    triton = FakeTriton(max_batch_size=2)
    async with unit_gateway(triton) as gateway:
        triton.gate = asyncio.Event()  # the healthy chunks wait; the one with "bad" fails at once
        triton.fail_on_text = "bad"
        response = await gateway.client.post(
            "/v1/predict", json={"texts": ["a", "b", "c", "d", "bad", "e"]}, headers=gateway.auth
        )
        assert response.status_code == 502, response.text
        assert response.json()["error"]["code"] == "upstream_error"
        waiting = [call for call in triton.infer_calls() if "bad" not in call.texts]
        assert len(waiting) == 2
        assert all(call.cancelled for call in waiting)


async def test_requests_are_refused_with_503_until_the_warm_up_passed() -> None:
    triton = FakeTriton(ready=False, not_ready_reason="Triton unreachable at test")
    async with unit_gateway(triton, wait_ready=False) as gateway:
        response = await gateway.client.post(
            "/v1/predict", json={"texts": ["hi"]}, headers=gateway.auth
        )
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "not_ready"
        assert response.headers["retry-after"] == "1"
        assert not triton.calls


async def test_models_route_lists_the_repository_and_the_routes(gateway: UnitGateway) -> None:
    response = await gateway.client.get("/v1/models", headers=gateway.auth)
    assert response.status_code == 200
    body = response.json()
    assert body["routes"] == {"/v1/predict": "text_regression", "/v1/embed": "text_embedding"}
    assert {model["name"] for model in body["models"]} >= {
        "text_regression_v1",
        "text_embedding_v1",
    }


def test_error_docs_come_from_the_error_classes() -> None:
    responses = error_responses(errors.NotReady, errors.UpstreamUnavailable, errors.Unauthorized)
    assert set(responses) == {401, 503}
    assert "`not_ready`" in responses[503]["description"]
    assert "`upstream_unavailable`" in responses[503]["description"]
    assert "Retry-After" in responses[503]["headers"]
    assert "WWW-Authenticate" in responses[401]["headers"]
