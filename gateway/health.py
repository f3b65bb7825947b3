"""Liveness, and readiness gated on a real warm-up, kept true by a background monitor.

Ready means: Triton is live and ready, every routed model is ready, the connection hooks (shared
memory registration) ran and a warm-up request went through each ensemble since the gateway last
(re)connected. When Triton goes away readiness drops at the next poll; when it returns, hooks and
warm-up run again before readiness comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.responses import OrjsonResponse
from gateway.schemas import HealthResponse
from gateway.settings import Settings
from gateway.triton.client import TritonClient

log = logging.getLogger(__name__)

WARMUP_TEXTS = ["Warm-up: a short product review.", "A longer warm-up review. " * 12]
ConnectHook = Callable[[], Awaitable[None]]


class Readiness:
    """The current readiness verdict and what the warm-up learnt about the models."""

    def __init__(self) -> None:
        self.ready = False
        self.reason = "starting: Triton not contacted yet"
        self.max_batch_size: dict[str, int] = {}
        self.warmed_at: float | None = None


class ReadinessMonitor:
    """Polls Triton every ``health_interval_s``; warms up after every (re)connection."""

    def __init__(
        self,
        client: TritonClient,
        settings: Settings,
        metrics: GatewayMetrics,
        connect_hooks: list[ConnectHook] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.state = Readiness()
        self.connect_hooks = connect_hooks or []
        self._task: asyncio.Task[None] | None = None
        self._warm = False

    @property
    def models(self) -> list[str]:
        """The Triton models the gateway routes to."""
        return [self.settings.regression_model, self.settings.embedding_model]

    def start(self) -> None:
        """Start polling in the background."""
        self._task = asyncio.create_task(self._run(), name="readiness-monitor")

    async def stop(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _set(self, ready: bool, reason: str) -> None:
        if ready != self.state.ready or reason != self.state.reason:
            log.info("readiness changed", extra={"ready": ready, "reason": reason})
        self.state.ready = ready
        self.state.reason = reason
        self.metrics.ready.set(1 if ready else 0)

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("readiness check failed")
                self._warm = False
                self._set(False, "readiness check failed; see logs")
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.settings.health_interval_s - elapsed))

    async def check_once(self) -> None:
        """One poll: verify Triton and the models; after a (re)connection, run hooks and warm up."""
        probe_timeout = max(0.2, min(1.0, self.settings.health_interval_s * 2))
        healthy, reason = await self.client.is_ready(self.models, probe_timeout)
        if not healthy:
            self._warm = False
            self._set(False, reason)
            return
        if self._warm:
            return
        self._set(False, "warming up")
        try:
            for hook in self.connect_hooks:
                await hook()
            await asyncio.wait_for(self._warm_up(), self.settings.warmup_timeout_s)
        except (GatewayError, TimeoutError) as exc:
            self._set(False, f"warm-up failed: {exc}")
            return
        self._warm = True
        self.state.warmed_at = time.time()
        self._set(True, "ready")

    async def _warm_up(self) -> None:
        sizes = {}
        for model in self.models:
            sizes[model] = await self.client.read_model_config(
                model, self.settings.request_timeout_s
            )
        # A real request through each ensemble: the first one after a (re)start must not be slow.
        await self.client.infer_texts(
            self.settings.regression_model,
            WARMUP_TEXTS,
            "score",
            timeout_s=self.settings.warmup_timeout_s,
        )
        await self.client.infer_texts(
            self.settings.embedding_model,
            WARMUP_TEXTS,
            "embedding",
            timeout_s=self.settings.warmup_timeout_s,
        )
        self.state.max_batch_size = sizes


router = APIRouter(tags=["health"])


@router.get(
    "/livez",
    operation_id="livez",
    summary="Liveness: 200 while the process runs",
    response_model=HealthResponse,
)
async def livez() -> Response:
    """Always 200 while the process serves requests."""
    return OrjsonResponse({"status": "alive", "reason": None})


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="Readiness: 200 only when Triton, the models and the warm-up are all good",
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse, "description": "Not ready, with the reason"}},
)
async def readyz(request: Request) -> Response:
    """200 when ready to take traffic, else 503 with the reason and ``Retry-After``."""
    monitor: ReadinessMonitor = request.app.state.monitor
    state = monitor.state
    if state.ready:
        return OrjsonResponse({"status": "ready", "reason": None})
    return OrjsonResponse(
        {"status": "not_ready", "reason": state.reason},
        status_code=503,
        headers={"Retry-After": str(monitor.settings.retry_after_s)},
    )
