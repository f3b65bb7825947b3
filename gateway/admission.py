"""Admission control: bounded work in Triton per model, and a bounded, deadline-aware wait queue.

Without it a burst collapses the service: every request goes to Triton, Triton's queue grows,
each request waits behind all the others until its deadline passes, and Triton keeps executing
work whose callers have given up (goodput falls to a fraction of capacity, latency to the deadline).

The unit is the text (a request of n texts costs n). Per model:

- **In flight** (sent to Triton, not answered) is capped by a limit that follows Little's law:
  ``measured drain rate x target_s``, between a floor and a ceiling. The drain rate is measured
  only while requests wait (then it is the model's capacity, not the arrival rate). So the work
  inside Triton drains in about ``target_s``, whatever the hardware: a few texts on the 2-core
  CPU, hundreds on a GPU.
- **Waiting** requests queue in FIFO order, at most ``max_queue`` texts.
- A request is **refused at once** (503 with ``Retry-After``) when the queue is full, or when the
  queue ahead of it would not drain (at the measured rate) before its own deadline or within
  ``max_wait_s``; a waiter still queued after ``max_wait_s`` (or at its deadline) is refused
  then. An immediate refusal costs microseconds; Triton never sees a refused request.

``Retry-After`` is the time the whole backlog needs to drain at the measured rate, in whole seconds.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from gateway import errors
from gateway.metrics import GatewayMetrics

# Completions older than this no longer count towards the drain rate.
RATE_WINDOW_S = 2.0
# Completions closer together than this count as this far apart (no division by zero).
MIN_SPAN_S = 0.001


@dataclass(frozen=True)
class AdmissionLimits:
    """The sizes of one model's admission control (texts and seconds)."""

    target_s: float
    max_wait_s: float
    min_in_flight: int
    max_in_flight: int
    max_queue: int


class DrainRate:
    """Texts completed per second over the last ``RATE_WINDOW_S`` seconds (of those recorded).

    The oldest completion in the window marks where the measured span starts, so its own texts
    (done before the span) do not count: the rate is the texts completed after it over the time
    since it. One completion is no measurement (0.0, unknown): dividing it by a guessed span
    understated a burst's first drain by orders of magnitude and refused requests that would
    have been served in time. A stall lowers the rate as the span grows without completions.
    """

    def __init__(self) -> None:
        self._completions: deque[tuple[float, int]] = deque()
        self._total = 0

    def record(self, texts: int, now: float) -> None:
        """``texts`` finished at ``now``."""
        self._completions.append((now, texts))
        self._total += texts
        self._expire(now)

    def per_second(self, now: float) -> float:
        """The rate; 0.0 (unknown) until two completions fall in the window."""
        self._expire(now)
        if len(self._completions) < 2:
            return 0.0
        started, first_texts = self._completions[0]
        return (self._total - first_texts) / max(now - started, MIN_SPAN_S)

    def _expire(self, now: float) -> None:
        while self._completions and now - self._completions[0][0] > RATE_WINDOW_S:
            _, texts = self._completions.popleft()
            self._total -= texts


@dataclass
class _Waiter:
    cost: int
    granted: asyncio.Future[None]


class AdmissionController:
    """Admission for one model; use :meth:`admit` around each request's Triton calls."""

    def __init__(
        self,
        model: str,
        limits: AdmissionLimits,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.limits = limits
        self.metrics = metrics
        self.clock = clock
        self.in_flight = 0
        self.queued = 0
        self._waiters: deque[_Waiter] = deque()
        self._rate = DrainRate()
        self._publish()

    def limit(self, now: float) -> int:
        """The in-flight limit now: measured drain rate x target, between floor and ceiling."""
        wanted = self._rate.per_second(now) * self.limits.target_s
        return max(self.limits.min_in_flight, min(self.limits.max_in_flight, int(wanted)))

    def retry_after_s(self, now: float) -> int:
        """Whole seconds the backlog (in flight and queued) needs to drain; at least 1."""
        rate = self._rate.per_second(now)
        if rate <= 0:
            return 1
        return max(1, math.ceil((self.in_flight + self.queued) / rate))

    @asynccontextmanager
    async def admit(self, texts: int, deadline: float) -> AsyncIterator[None]:
        """Hold ``texts`` of in-flight capacity for the block; wait for it in the queue, or raise
        :class:`errors.Overloaded` at once when it would not come in time.

        ``deadline`` is an instant of the controller's clock (``time.monotonic``): the request's own.
        """
        cost = max(1, min(texts, self.limits.max_in_flight))
        started = self.clock()
        if not self._waiters and self._fits(cost, started):
            self.in_flight += cost
            self._count("admitted")
        else:
            await self._wait(cost, deadline, started)
        self.metrics.admission_wait.labels(self.model).observe(self.clock() - started)
        self._publish()
        try:
            yield
        finally:
            self.in_flight -= cost
            if self._waiters:
                # Only a completion with work waiting measures capacity: one at low load measures
                # the arrival rate, and would make the queue look slower than it is.
                self._rate.record(cost, self.clock())
            self._grant()
            self._publish()

    def _fits(self, cost: int, now: float) -> bool:
        # Into an idle model any request fits: one larger than the limit runs alone, not never.
        return self.in_flight == 0 or self.in_flight + cost <= self.limit(now)

    async def _wait(self, cost: int, deadline: float, now: float) -> None:
        # A request larger than the queue may still wait alone in an empty one.
        alone = self.queued == 0 and self.limits.max_queue > 0
        if self.queued + cost > self.limits.max_queue and not alone:
            self._refuse("queue_full", f"the {self.model} queue is full", now)
        rate = self._rate.per_second(now)
        if rate > 0:
            # Everything ahead (and this request's own share) drains at the measured rate.
            expected = (self.in_flight + self.queued + cost - self.limit(now)) / rate
            budget = min(deadline - now, self.limits.max_wait_s)
            if expected > budget:
                self._refuse(
                    "deadline",
                    f"{self.model} would start in about {expected:.2f} s, after this request's "
                    f"budget of {max(budget, 0.0):.2f} s",
                    now,
                )
        waiter = _Waiter(cost, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self.queued += cost
        self._publish()
        timeout = min(deadline - now, self.limits.max_wait_s)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.granted), max(timeout, 0.0))
        except (TimeoutError, asyncio.TimeoutError):
            if not waiter.granted.done():
                self._remove(waiter)
                self._refuse("expired", f"waited {timeout:.2f} s for {self.model}", now)
        except asyncio.CancelledError:
            if waiter.granted.done():
                # Granted and cancelled at once: hand the capacity on.
                self.in_flight -= cost
                self._grant()
            else:
                self._remove(waiter)
            self._publish()
            raise
        self._count("admitted")

    def _remove(self, waiter: _Waiter) -> None:
        self._waiters.remove(waiter)
        self.queued -= waiter.cost
        self._grant()

    def _grant(self) -> None:
        """Admit waiters in FIFO order while the limit allows (never skipping the head)."""
        now = self.clock()
        while self._waiters and self._fits(self._waiters[0].cost, now):
            waiter = self._waiters.popleft()
            self.queued -= waiter.cost
            self.in_flight += waiter.cost
            waiter.granted.set_result(None)

    def _refuse(self, reason: str, message: str, now: float) -> None:
        self._count(f"refused_{reason}")
        raise errors.Overloaded(f"overloaded: {message}", self.retry_after_s(now))

    def _count(self, outcome: str) -> None:
        self.metrics.admission_decisions.labels(self.model, outcome).inc()

    def _publish(self) -> None:
        self.metrics.admission_in_flight.labels(self.model).set(self.in_flight)
        self.metrics.admission_queued.labels(self.model).set(self.queued)
        self.metrics.admission_limit.labels(self.model).set(self.limit(self.clock()))
