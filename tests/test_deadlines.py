"""Deadlines reach Triton: a request whose caller gave up is dropped before the encoder runs it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient

from devtools.triton import EmbeddedTriton
from tests.conftest import model_statistics, wait_for
from tests.gateway_support import RunningGateway

BUSY_REQUESTS, BUSY_TEXTS = 6, 64
LONG_TEXT = "a long enough review of a kettle that boils fast but leaks at the lid. " * 6


def busy_request(url: str) -> None:
    """One large request straight to Triton: seconds of encoder work on this CPU."""
    texts = [f"{i}: {LONG_TEXT}" for i in range(BUSY_TEXTS)]
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
        client.infer("text_regression_v1", [tensor], client_timeout=300)


def test_requests_whose_deadline_passed_never_reach_the_encoder(
    triton: EmbeddedTriton, gateway: RunningGateway
) -> None:
    before = {m: model_statistics(triton, f"{m}_v1") for m in ("preprocess", "bert")}
    with ThreadPoolExecutor(BUSY_REQUESTS) as pool:
        busy = [pool.submit(busy_request, triton.grpc_url) for _ in range(BUSY_REQUESTS)]
        # Every busy request is past preprocess, so the encoder's queue holds seconds of work.
        wait_for(
            lambda: (
                model_statistics(triton, "preprocess_v1")["inference_count"]
                - before["preprocess"]["inference_count"]
                >= BUSY_REQUESTS * BUSY_TEXTS
            ),
            60,
            "the busy requests to reach the encoder",
        )
        with gateway.client(headers={"X-Request-Timeout": "0.3"}) as client:
            answers = [client.post("/v1/predict", json={"texts": [f"short {i}"]}) for i in range(3)]
        for future in busy:
            future.result()
    # The callers gave up (503 from Triton's queue policy, or 504 at the gateway's deadline)...
    assert {answer.status_code for answer in answers} <= {503, 504}, [a.text for a in answers]
    after = {m: model_statistics(triton, f"{m}_v1") for m in ("preprocess", "bert")}
    # ...and the encoder executed the busy texts alone: the abandoned requests never reached it.
    assert (
        after["bert"]["inference_count"] - before["bert"]["inference_count"]
        == BUSY_REQUESTS * BUSY_TEXTS
    )
