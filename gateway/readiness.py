"""Readiness gated on a real warm-up, kept true by a background monitor.

Ready means: Triton is live, every routed model is ready, the client's transport is set
up (shared-memory registration) and a warm-up went through each ensemble since the gateway last
(re)connected. When Triton goes away readiness drops at the next poll; when it returns, the
transport set-up and the warm-up run again before readiness comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.triton.api import TritonApi

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Readiness:
    """The current readiness verdict and its reason."""

    ready: bool
    reason: str


class ReadinessMonitor:
    """Polls Triton every ``health_interval_s``; after every (re)connection sets up and warms up."""

    def __init__(
        self,
        client: TritonApi,
        models: Callable[[], Sequence[str]],
        warm_up: Callable[[], Awaitable[None]],
        refresh: Callable[[], Awaitable[object]],
        settings: Settings,
        metrics: GatewayMetrics,
    ) -> None:
        """``models``: the models that must be ready now; ``warm_up``: run after each
        (re)connection; ``refresh``: run at every poll while ready (its failures are logged and
        leave readiness as it is)."""
        self.client = client
        self.models = models
        self.warm_up = warm_up
        self.refresh = refresh
        self.settings = settings
        self.metrics = metrics
        self.state = Readiness(False, "starting: Triton not contacted yet")
        self._task: asyncio.Task[None] | None = None
        self._warm = False

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
            self.state = Readiness(ready, reason)
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
        """One poll: verify Triton and the models; after a (re)connection, set up and warm up."""
        probe_timeout = max(0.2, min(1.0, self.settings.health_interval_s * 2))
        healthy, reason = await self.client.is_ready(self.models(), probe_timeout)
        if not healthy:
            self._warm = False
            self._set(False, reason)
            return
        if self._warm:
            try:
                await self.refresh()
            except (GatewayError, TimeoutError, asyncio.TimeoutError) as exc:
                log.warning("refresh failed", extra={"error": str(exc) or type(exc).__name__})
            return
        self._set(False, "warming up")
        try:
            await self.client.connect()
            await asyncio.wait_for(self.warm_up(), self.settings.warmup_timeout_s)
        # asyncio.TimeoutError is not the builtin TimeoutError before Python 3.11.
        except (GatewayError, TimeoutError, asyncio.TimeoutError) as exc:
            self._set(False, f"warm-up failed: {exc or type(exc).__name__}")
            return
        self._warm = True
        self._set(True, "ready")
