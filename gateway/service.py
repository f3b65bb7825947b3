"""The inference service: what the routes call, and the owner of every Triton call they need.

It validates limits, admits each request through the model's admission control (bounded work in
Triton, a bounded deadline-aware queue: ``gateway/admission.py``), splits requests above a model's
``max_batch_size`` into concurrent Triton calls and reassembles them in order, all or nothing, and
keeps the gateway's readiness (the warm-up that gates it reads each model's configuration: the one
record of what the gateway knows of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from gateway import errors
from gateway.admission import AdmissionController, AdmissionLimits
from gateway.context import timings_var
from gateway.metrics import GatewayMetrics
from gateway.readiness import Readiness, ReadinessMonitor
from gateway.settings import Settings
from gateway.triton.api import InferOutcome, ModelInfo, RepositoryEntry, TritonApi

T = TypeVar("T")
SCORE_OUTPUT = "score"
EMBEDDING_OUTPUT = "embedding"
WARMUP_TEXTS = ("Warm-up: a short product review.", "A longer warm-up review. " * 12)


@dataclass(frozen=True)
class ModelResult:
    """Rows of one output tensor, in request order, and the model version that produced them."""

    model_name: str
    model_version: str
    values: npt.NDArray[np.float32]


class InferenceService:
    """Runs texts through the routed Triton ensembles."""

    def __init__(self, client: TritonApi, settings: Settings, metrics: GatewayMetrics) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.routes = {
            "/v1/predict": settings.regression_model,
            "/v1/embed": settings.embedding_model,
        }
        # Filled by each warm-up; requests are refused (not ready) until the first one passed.
        self._models: dict[str, ModelInfo] = {}
        # Created at the first warm-up (sized from the model's configuration), kept across
        # re-warm-ups so that the measured drain rate survives a Triton restart.
        self._admission: dict[str, AdmissionController] = {}
        self._monitor = ReadinessMonitor(
            client, list(self.routes.values()), self.warm_up, settings, metrics
        )

    def start(self) -> None:
        """Start watching Triton: readiness follows once the first warm-up passed."""
        self._monitor.start()

    async def close(self) -> None:
        """Stop watching Triton and close the client."""
        await self._monitor.stop()
        await self.client.close()

    @property
    def readiness(self) -> Readiness:
        """Whether the gateway can take traffic now, and why not."""
        return self._monitor.state

    async def warm_up(self) -> None:
        """Read each routed model's configuration and run a real request through each ensemble,
        so that the first request after a (re)start is not slow."""
        timeout_s = self.settings.warmup_timeout_s
        models = {
            name: await self.client.model_info(name, self.settings.request_timeout_s)
            for name in self.routes.values()
        }
        await self.client.infer_texts(
            models[self.settings.regression_model], WARMUP_TEXTS, SCORE_OUTPUT, timeout_s=timeout_s
        )
        await self.client.infer_texts(
            models[self.settings.embedding_model],
            WARMUP_TEXTS,
            EMBEDDING_OUTPUT,
            timeout_s=timeout_s,
        )
        if self.settings.admission_enabled:
            for name, info in models.items():
                if name not in self._admission:
                    self._admission[name] = AdmissionController(
                        name, self.admission_limits(info), self.metrics
                    )
        self._models = models

    def admission_limits(self, model: ModelInfo) -> AdmissionLimits:
        """The model's admission sizes: the settings, with defaults from its ``max_batch_size``."""
        settings = self.settings
        batch = max(1, model.max_batch_size)
        ceiling = settings.admission_max_in_flight or 2 * batch
        return AdmissionLimits(
            target_s=settings.admission_target_s,
            max_wait_s=settings.admission_max_wait_s,
            min_in_flight=min(settings.admission_min_in_flight, ceiling),
            max_in_flight=ceiling,
            max_queue=batch
            if settings.admission_max_queue is None
            else settings.admission_max_queue,
        )

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

    async def repository(self) -> list[RepositoryEntry]:
        """Every model version in Triton's repository with its state."""
        return await self.client.repository_index(self.settings.request_timeout_s)

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
        model_name: str,
        output: str,
        texts: Sequence[str],
        model_version: str | None,
        timeout_s: float,
        request_id: str,
    ) -> ModelResult:
        self.check_limits(texts)
        self.metrics.texts_per_request.labels(route).observe(len(texts))
        state = self.readiness
        model = self._models.get(model_name)
        if not state.ready or model is None:
            raise errors.NotReady(f"not ready: {state.reason}", self.settings.retry_after_s)
        deadline = time.monotonic() + timeout_s
        admission = self._admission.get(model_name)
        async with admission.admit(len(texts), deadline) if admission else contextlib.nullcontext():
            outcomes, elapsed = await self._infer_chunks(
                model, output, texts, model_version, deadline, request_id
            )
        # The transports the chunks really used, mixed only when some chunks of one request fell
        # back from shared memory: e.g. "grpc+system_shm".
        transports = "+".join(sorted({outcome.transport for outcome in outcomes}))
        self.metrics.triton_latency.labels(model_name, transports).observe(elapsed)
        versions = {outcome.model_version for outcome in outcomes}
        values = (
            outcomes[0].array if len(outcomes) == 1 else np.concatenate([o.array for o in outcomes])
        )
        return ModelResult(model_name, ",".join(sorted(versions)), values)

    async def _infer_chunks(
        self,
        model: ModelInfo,
        output: str,
        texts: Sequence[str],
        model_version: str | None,
        deadline: float,
        request_id: str,
    ) -> tuple[list[InferOutcome], float]:
        """The Triton calls of one request (split above ``max_batch_size``), and their time."""
        # The time left after the admission queue: Triton gets it too, and drops the request
        # unexecuted once it passes (the models' queue policy, timeout_action REJECT).
        timeout_s = deadline - time.monotonic()
        if timeout_s <= 0:
            raise errors.UpstreamTimeout("the deadline passed before the request reached Triton")
        limit = model.max_batch_size or len(texts)
        chunks = [texts[start : start + limit] for start in range(0, len(texts), limit)]
        started = time.perf_counter()
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
        except errors.GatewayError as exc:
            self.metrics.triton_errors.labels(model.name, exc.upstream_status or exc.code).inc()
            raise
        finally:
            elapsed = time.perf_counter() - started
            timings = timings_var.get()
            if timings is not None:
                timings.triton_seconds += elapsed
        return outcomes, elapsed


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
