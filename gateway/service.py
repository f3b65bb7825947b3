"""The inference service: what the routes call. It validates limits, splits requests above a
model's ``max_batch_size`` into concurrent Triton calls and reassembles them in order, all or nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from gateway import errors
from gateway.context import timings_var
from gateway.health import ReadinessMonitor
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.triton.client import TritonClient

T = TypeVar("T")
SCORE_OUTPUT = "score"
EMBEDDING_OUTPUT = "embedding"


@dataclass(frozen=True)
class ModelResult:
    """Rows of one output tensor, in request order, and the model version that produced them."""

    model_name: str
    model_version: str
    values: npt.NDArray[np.float32]


class InferenceService:
    """Runs texts through the routed Triton ensembles."""

    def __init__(
        self,
        client: TritonClient,
        settings: Settings,
        metrics: GatewayMetrics,
        monitor: ReadinessMonitor,
    ) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.monitor = monitor

    async def predict(
        self, texts: Sequence[str], model_version: str | None, timeout_s: float, request_id: str
    ) -> ModelResult:
        """One score per text."""
        result = await self._run(
            "predict",
            self.settings.regression_model,
            SCORE_OUTPUT,
            texts,
            model_version,
            timeout_s,
            request_id,
        )
        return ModelResult(result.model_name, result.model_version, result.values.reshape(-1))

    async def embed(
        self, texts: Sequence[str], model_version: str | None, timeout_s: float, request_id: str
    ) -> ModelResult:
        """One embedding per text."""
        return await self._run(
            "embed",
            self.settings.embedding_model,
            EMBEDDING_OUTPUT,
            texts,
            model_version,
            timeout_s,
            request_id,
        )

    def check_limits(self, texts: Sequence[str]) -> None:
        """InvalidRequest when ``texts`` breaks a configured limit."""
        if len(texts) > self.settings.max_texts_per_request:
            raise errors.InvalidRequest(
                f"{len(texts)} texts in one request; the limit is {self.settings.max_texts_per_request}"
            )
        too_long = [i for i, text in enumerate(texts) if len(text) > self.settings.max_text_chars]
        if too_long:
            raise errors.InvalidRequest(
                f"texts longer than {self.settings.max_text_chars} characters at indexes {too_long[:10]}"
            )

    async def _run(
        self,
        route: str,
        model: str,
        output: str,
        texts: Sequence[str],
        model_version: str | None,
        timeout_s: float,
        request_id: str,
    ) -> ModelResult:
        self.check_limits(texts)
        self.metrics.texts_per_request.labels(route).observe(len(texts))
        state = self.monitor.state
        if not state.ready:
            raise errors.NotReady(f"not ready: {state.reason}", self.settings.retry_after_s)
        limit = state.max_batch_size.get(model) or len(texts)
        chunks = [texts[start : start + limit] for start in range(0, len(texts), limit)]
        started = time.perf_counter()
        # The transports the chunks really used ("grpc" for any that fell back from shm).
        transports: set[str] = set()
        try:
            outcomes = await all_or_nothing(
                [
                    self.client.infer_texts(
                        model,
                        chunk,
                        output,
                        model_version=model_version or "",
                        timeout_s=timeout_s,
                        request_id=f"{request_id}/{index}" if len(chunks) > 1 else request_id,
                    )
                    for index, chunk in enumerate(chunks)
                ]
            )
            transports.update(outcome.transport for outcome in outcomes)
        except errors.GatewayError as exc:
            self.metrics.triton_errors.labels(model, exc.upstream_status or exc.code).inc()
            raise
        finally:
            elapsed = time.perf_counter() - started
            timings = timings_var.get()
            if timings is not None:
                timings.triton_seconds += elapsed
                timings.triton_calls += len(chunks)
                timings.transports.update(transports)
        # Mixed only when some chunks of one request fell back: e.g. "grpc+system_shm".
        self.metrics.triton_latency.labels(model, "+".join(sorted(transports))).observe(elapsed)
        versions = {outcome.model_version for outcome in outcomes}
        values = (
            outcomes[0].array if len(outcomes) == 1 else np.concatenate([o.array for o in outcomes])
        )
        return ModelResult(model, ",".join(sorted(versions)), values)


async def all_or_nothing(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``calls`` concurrently and return their results in order.

    On the first failure the other calls are cancelled and that failure is raised: a partial
    result is never returned as if whole.
    """
    if len(calls) == 1:
        return [await calls[0]]
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled():
                failure = task.exception()
                if failure is not None:
                    raise failure
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
