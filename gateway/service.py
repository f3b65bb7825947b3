"""The inference service: what the routes call, and the owner of every Triton call they need.

It validates limits, routes each request to a pipeline version (pinned by the caller, or by the
traffic policy: ``gateway/lifecycle/``), admits it through that version's admission control
(bounded work in Triton, a bounded deadline-aware queue: ``gateway/admission.py``), splits requests
above a model's ``max_batch_size`` into concurrent Triton calls and reassembles them in order, all
or nothing, answers a failed canary request from stable, copies routed requests to a shadow
version, and keeps the gateway's readiness (the warm-up that gates it reads each model's
configuration: the one record of what the gateway knows of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from gateway import errors
from gateway.admission import AdmissionController, AdmissionLimits
from gateway.context import timings_var
from gateway.lifecycle.manager import VersionManager
from gateway.lifecycle.store import FilePolicyStore, MemoryPolicyStore, PolicyStore
from gateway.metrics import GatewayMetrics
from gateway.readiness import Readiness, ReadinessMonitor
from gateway.settings import Settings
from gateway.triton.api import InferOutcome, ModelInfo, RepositoryEntry, TritonApi

T = TypeVar("T")
SCORE_OUTPUT = "score"
EMBEDDING_OUTPUT = "embedding"
WARMUP_TEXTS = ("Warm-up: a short product review.", "A longer warm-up review. " * 12)


@dataclass(frozen=True)
class RequestMeta:
    """Who asks, for which version, by when: what the service needs of an inference request."""

    caller: str  # the API key's digest: the canary choice is sticky per key
    model_version: str | None  # pinned by the caller, or None: the traffic policy decides
    timeout_s: float
    request_id: str


@dataclass(frozen=True)
class ModelResult:
    """Rows of one output tensor, in request order, and the pipeline version that produced them."""

    model_name: str
    model_version: str
    values: npt.NDArray[np.float32]


class InferenceService:
    """Runs texts through the routed Triton ensembles of the pipeline version each request gets."""

    def __init__(
        self,
        client: TritonApi,
        settings: Settings,
        metrics: GatewayMetrics,
        callers: Iterable[str] = (),
    ) -> None:
        """``callers``: the digests of the keys that may infer (the canary share is exact over them)."""
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.routes = {
            "/v1/predict": settings.regression_model,
            "/v1/embed": settings.embedding_model,
        }
        store: PolicyStore = (
            FilePolicyStore(settings.policy_path) if settings.policy_path else MemoryPolicyStore()
        )
        self.versions = VersionManager(
            client, settings, metrics, store, self._warm_version, callers
        )
        # Per Triton model (one per pipeline version), created at the version's warm-up (sized
        # from its configuration) and kept across re-warm-ups, so that the measured drain rate
        # survives a Triton restart.
        self._admission: dict[str, AdmissionController] = {}
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        self._monitor = ReadinessMonitor(
            client,
            self.versions.routed_models,
            self.versions.prepare,
            self.versions.refresh,
            settings,
            metrics,
        )

    def start(self) -> None:
        """Start watching Triton: readiness follows once the first warm-up passed."""
        self._monitor.start()

    async def close(self) -> None:
        """Stop watching Triton, drop shadow copies in flight, and close the client."""
        await self._monitor.stop()
        for task in list(self._shadow_tasks):
            task.cancel()
        await asyncio.gather(*self._shadow_tasks, return_exceptions=True)
        await self.client.close()

    @property
    def readiness(self) -> Readiness:
        """Whether the gateway can take traffic now, and why not."""
        return self._monitor.state

    async def _warm_version(self, models: dict[str, ModelInfo]) -> None:
        """Run a real request through each ensemble of one pipeline version, so that its first
        request is not slow, and size its admission control."""
        timeout_s = self.settings.warmup_timeout_s
        outputs = {
            self.settings.regression_model: SCORE_OUTPUT,
            self.settings.embedding_model: EMBEDDING_OUTPUT,
        }
        for model, info in models.items():
            await self.client.infer_texts(info, WARMUP_TEXTS, outputs[model], timeout_s=timeout_s)
            if self.settings.admission_enabled and info.name not in self._admission:
                self._admission[info.name] = AdmissionController(
                    info.name, self.admission_limits(info), self.metrics
                )

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

    async def predict(self, texts: Sequence[str], request: RequestMeta) -> ModelResult:
        """One score per text."""
        result = await self._run(
            "predict", self.settings.regression_model, SCORE_OUTPUT, texts, request
        )
        return ModelResult(result.model_name, result.model_version, result.values.reshape(-1))

    async def embed(self, texts: Sequence[str], request: RequestMeta) -> ModelResult:
        """One embedding per text."""
        return await self._run(
            "embed", self.settings.embedding_model, EMBEDDING_OUTPUT, texts, request
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
        self, route: str, model: str, output: str, texts: Sequence[str], request: RequestMeta
    ) -> ModelResult:
        self.check_limits(texts)
        self.metrics.texts_per_request.labels(route).observe(len(texts))
        state = self.readiness
        if not state.ready:
            raise errors.NotReady(f"not ready: {state.reason}", self.settings.retry_after_s)
        pinned = int(request.model_version) if request.model_version else None
        version, role = self.versions.route(request.caller, pinned)
        started = time.monotonic()
        deadline = started + request.timeout_s
        try:
            values = await self._serve(version, model, output, texts, deadline, request.request_id)
        except errors.GatewayError as exc:
            # Only what the server is answerable for counts against a version.
            self.versions.record(
                version, role, model, exc.status_code < 500, time.monotonic() - started
            )
            stable = self.versions.policy.stable if self.versions.policy else version
            if not (
                role == "canary"
                and exc.status_code >= 500
                and self.settings.canary_fallback
                and time.monotonic() < deadline
            ):
                raise
            # The canary failed this caller: stable answers instead (the guard has counted it).
            version, role, started = stable, "stable", time.monotonic()
            values = await self._serve(version, model, output, texts, deadline, request.request_id)
        self.versions.record(version, role, model, True, time.monotonic() - started)
        if role != "pinned":
            self._copy_to_shadow(model, output, texts, values, request.request_id)
        return ModelResult(model, str(version), values)

    async def _serve(
        self,
        version: int,
        model: str,
        output: str,
        texts: Sequence[str],
        deadline: float,
        request_id: str,
    ) -> npt.NDArray[np.float32]:
        """One request on one pipeline version: admission, the Triton calls, their metrics."""
        info = self.versions.model(version, model)
        admission = self._admission.get(info.name)
        with self.versions.serving(version):
            async with (
                admission.admit(len(texts), deadline) if admission else contextlib.nullcontext()
            ):
                outcomes, elapsed = await self._infer_chunks(
                    info, output, texts, deadline, request_id
                )
        # The transports the chunks really used, mixed only when some chunks of one request fell
        # back from shared memory: e.g. "grpc+system_shm".
        transports = "+".join(sorted({outcome.transport for outcome in outcomes}))
        self.metrics.triton_latency.labels(info.name, transports).observe(elapsed)
        if len(outcomes) == 1:
            return outcomes[0].array
        return np.concatenate([o.array for o in outcomes])

    def _copy_to_shadow(
        self,
        model: str,
        output: str,
        texts: Sequence[str],
        served: npt.NDArray[np.float32],
        request_id: str,
    ) -> None:
        """Send a copy to the shadow version in the background (never waited for, never
        returned); over ``shadow_max_in_flight`` copies the copy is dropped, not queued."""
        version = self.versions.shadow()
        if version is None:
            return
        if len(self._shadow_tasks) >= self.settings.shadow_max_in_flight:
            self.metrics.shadow_requests.labels(model, "dropped").inc()
            return
        task = asyncio.create_task(self._shadow(version, model, output, texts, served, request_id))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _shadow(
        self,
        version: int,
        model: str,
        output: str,
        texts: Sequence[str],
        served: npt.NDArray[np.float32],
        request_id: str,
    ) -> None:
        deadline = time.monotonic() + self.settings.request_timeout_s
        try:
            values = await self._serve(
                version, model, output, texts, deadline, f"{request_id}/shadow"
            )
        except errors.GatewayError:
            self.metrics.shadow_requests.labels(model, "error").inc()
            return
        self.metrics.shadow_requests.labels(model, "ok").inc()
        self.metrics.shadow_drift.labels(model).observe(drift(served, values))

    async def _infer_chunks(
        self,
        model: ModelInfo,
        output: str,
        texts: Sequence[str],
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


def drift(served: npt.NDArray[np.float32], shadow: npt.NDArray[np.float32]) -> float:
    """Mean per-text difference of two answers: |score difference| for scores (one value per
    text), cosine distance for (L2-normalised) embeddings."""
    if served.ndim == 1 or served.shape[-1] == 1:
        return float(np.mean(np.abs(served.reshape(-1) - shadow.reshape(-1))))
    return float(np.mean(1.0 - np.sum(served * shadow, axis=1)))


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
