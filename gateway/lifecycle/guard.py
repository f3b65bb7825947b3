"""The canary guard: compares the canary with stable over a sliding window and says when the
canary must be rolled back (its error rate or its p99 latency past thresholds relative to stable).

Only failures the server is answerable for count (Triton errors, timeouts, refusals): a caller's
invalid request says nothing about a version. The error rate is compared once the canary has
``min_requests`` in the window; p99 once both sides have ``min_latency_requests`` (a p99 of 20
samples is their maximum, and one slow request is no verdict).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Samples kept per version, whatever the window: bounds memory at any request rate.
MAX_SAMPLES = 20_000


@dataclass(frozen=True)
class GuardLimits:
    """When a canary is rolled back (settings ``canary_*``)."""

    window_s: float
    min_requests: int
    # A p99 of fewer samples is their maximum: one slow request would roll a canary back.
    min_latency_requests: int
    max_error_rate_increase: float
    max_p99_ratio: float
    p99_slack_s: float


@dataclass(frozen=True)
class WindowStats:
    """One version's requests in the window."""

    requests: int
    errors: int
    p99_s: float

    @property
    def error_rate(self) -> float:
        """Failed / all (0 with no requests)."""
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Verdict:
    """Why a canary must go: which threshold it passed (``error_rate``, ``p99``) and the figures."""

    kind: str
    reason: str


class CanaryGuard:
    """Per-version outcome windows and the rollback verdict."""

    def __init__(self, limits: GuardLimits) -> None:
        self.limits = limits
        self._samples: dict[int, deque[tuple[float, bool, float]]] = {}

    def record(self, version: int, ok: bool, latency_s: float, now: float) -> None:
        """One request served (``ok``) or failed by ``version``."""
        samples = self._samples.setdefault(version, deque(maxlen=MAX_SAMPLES))
        samples.append((now, ok, latency_s))

    def stats(self, version: int, now: float) -> WindowStats:
        """``version``'s requests within the window."""
        samples = self._samples.get(version)
        if not samples:
            return WindowStats(0, 0, 0.0)
        while samples and now - samples[0][0] > self.limits.window_s:
            samples.popleft()
        latencies = sorted(latency for _, ok, latency in samples if ok)
        failures = sum(1 for _, ok, _ in samples if not ok)
        p99 = (
            latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)]
            if latencies
            else 0.0
        )
        return WindowStats(len(samples), failures, p99)

    def verdict(self, stable: int, canary: int, now: float) -> Verdict | None:
        """Why ``canary`` must be rolled back now, or None while it holds up."""
        limits = self.limits
        mine = self.stats(canary, now)
        if mine.requests < limits.min_requests:
            return None
        theirs = self.stats(stable, now)
        if mine.error_rate > theirs.error_rate + limits.max_error_rate_increase:
            return Verdict(
                "error_rate",
                f"canary v{canary} error rate {mine.error_rate:.1%} over {mine.requests} requests "
                f"vs stable v{stable} {theirs.error_rate:.1%} (allowed: "
                f"+{limits.max_error_rate_increase:.1%})",
            )
        enough = min(mine.requests, theirs.requests) >= limits.min_latency_requests
        if enough and mine.p99_s > max(
            theirs.p99_s * limits.max_p99_ratio, theirs.p99_s + limits.p99_slack_s
        ):
            return Verdict(
                "p99",
                f"canary v{canary} p99 {mine.p99_s * 1000:.0f} ms vs stable v{stable} "
                f"{theirs.p99_s * 1000:.0f} ms (allowed: x{limits.max_p99_ratio:g}, at least "
                f"+{limits.p99_slack_s * 1000:.0f} ms)",
            )
        return None

    def forget(self, version: int) -> None:
        """Drop ``version``'s window (it stopped being canary: a later canary starts afresh)."""
        self._samples.pop(version, None)
