"""Readiness gated on warm-up, kept true by the monitor; splitting above max_batch_size; cancellation."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from build_models.pipeline import ReferencePipeline
from build_models.profiles import render_repository
from devtools.ports import free_port
from devtools.triton import EmbeddedTriton
from tests.conftest import model_statistics, wait_for
from tests.gateway_support import RunningGateway, running_gateway

SMALL_BATCH = 8


def readyz(gateway: RunningGateway) -> httpx.Response:
    with gateway.client(key=None) as client:
        return client.get("/readyz")


def test_not_ready_and_fast_503_while_triton_is_absent() -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    with running_gateway(nowhere, wait_ready=False) as gateway:
        answer = readyz(gateway)
        assert answer.status_code == 503
        assert answer.json()["status"] == "not_ready" and answer.json()["reason"]
        assert answer.headers["retry-after"] == "1"
        with gateway.client() as client:
            response = client.post("/v1/predict", json={"texts": ["hello"]}, timeout=5)
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "not_ready"
        assert response.headers["retry-after"] == "1"
        with gateway.client() as client:
            assert "gateway_ready 0.0" in client.get("/metrics").text


def test_readiness_follows_triton_down_and_back(own_triton: EmbeddedTriton) -> None:
    with running_gateway(own_triton.grpc_url) as gateway:
        # Ready only after the gateway's own warm-up went through both ensembles.
        assert model_statistics(own_triton, "text_regression_v1")["success"] >= 1
        assert model_statistics(own_triton, "text_embedding_v1")["success"] >= 1
        assert readyz(gateway).status_code == 200

        own_triton.kill()
        wait_for(lambda: readyz(gateway).status_code == 503, 5, "readiness to drop")
        with gateway.client() as client:
            down = client.post("/v1/predict", json={"texts": ["hello"]}, timeout=5)
        assert down.status_code == 503 and "retry-after" in down.headers

        own_triton.start()
        # The fresh server has served nothing; readiness must wait for the gateway's warm-up.
        wait_for(lambda: readyz(gateway).status_code == 200, 60, "readiness to return")
        assert model_statistics(own_triton, "text_regression_v1")["success"] >= 1
        with gateway.client() as client:
            back = client.post("/v1/predict", json={"texts": ["hello"]})
        assert back.status_code == 200


@pytest.fixture(scope="module")
def small_batch_triton(
    built_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedTriton]:
    """Triton whose ensembles accept at most 8 texts per request."""
    repository = render_repository(tmp_path_factory.mktemp("small-batch"), "cpu", built_repository)
    for ensemble in ("text_regression_v1", "text_embedding_v1"):
        config = repository / ensemble / "config.pbtxt"
        config.write_text(
            re.sub(r"max_batch_size: \d+", f"max_batch_size: {SMALL_BATCH}", config.read_text())
        )
    with EmbeddedTriton(repository, tmp_path_factory.mktemp("small-batch-triton")) as server:
        yield server


def test_requests_above_max_batch_size_are_split_and_reassembled(
    small_batch_triton: EmbeddedTriton, built_repository: Path
) -> None:
    texts = [f"Review number {i}: " + "good " * (i % 7) + "bad " * (i % 5) for i in range(30)]
    with running_gateway(small_batch_triton.grpc_url) as gateway:
        before = model_statistics(small_batch_triton, "text_regression_v1")
        with gateway.client() as client:
            response = client.post("/v1/predict", json={"texts": texts})
            embedded = client.post("/v1/embed", json={"texts": texts})
        after = model_statistics(small_batch_triton, "text_regression_v1")
    assert response.status_code == 200, response.text
    assert after["success"] - before["success"] == 4  # ceil(30 / 8) concurrent Triton requests
    assert after["inference_count"] - before["inference_count"] == 30
    reference = ReferencePipeline(built_repository)
    expected = np.concatenate(
        [reference.score(texts[i : i + SMALL_BATCH]) for i in range(0, 30, SMALL_BATCH)]
    )
    np.testing.assert_allclose(response.json()["scores"], expected, atol=1e-4)
    assert len(embedded.json()["embeddings"]) == 30


def test_split_request_is_all_or_nothing(small_batch_triton: EmbeddedTriton) -> None:
    texts = ["a long review that takes a while " * 20] * 40
    with (
        running_gateway(small_batch_triton.grpc_url) as gateway,
        gateway.client(headers={"X-Request-Timeout": "0.02"}) as client,
    ):
        response = client.post("/v1/predict", json={"texts": texts})
    assert response.status_code == 504
    assert "scores" not in response.text


def test_client_disconnect_cancels_the_request(triton: EmbeddedTriton) -> None:
    texts = ["a very long review of a product that goes on and on " * 30] * 256
    body = json.dumps({"texts": texts}).encode()
    with running_gateway(triton.grpc_url) as gateway:
        host, port = gateway.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(
                b"POST /v1/predict HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                + f"X-API-Key: {gateway.infer_key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            wait_for(lambda: in_flight(gateway) == 1, 10, "the request to reach the gateway")
        # The socket is closed; 256 long texts would keep Triton busy for many seconds.
        wait_for(lambda: in_flight(gateway) == 0, 3, "the abandoned request to be cancelled")


def in_flight(gateway: RunningGateway) -> float:
    return gateway.metric("gateway_requests_in_flight")


def test_metrics_can_require_a_key(triton: EmbeddedTriton) -> None:
    with running_gateway(triton.grpc_url, protect_metrics=True) as gateway:
        with gateway.client(key=None) as client:
            assert client.get("/metrics").status_code == 401
        with gateway.client() as client:
            assert client.get("/metrics").status_code == 200
