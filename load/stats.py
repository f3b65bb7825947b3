"""Statistics of one measured phase: latency percentiles, rates and errors by kind."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast


@dataclass(frozen=True)
class Sample:
    """One request: when it was due and started, how long it took (s), and how it ended.

    ``scheduled`` is the arrival time the workload asked for (open loop) or the send time (closed
    loop); ``latency`` is measured from it, so time spent queueing in the client counts.
    """

    scheduled: float
    latency: float
    texts: int
    error: str | None = None
    # The Retry-After header of a refused request, as sent.
    retry_after: str | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``q`` percent of values <= it.

    Nearest rank never interpolates, so every reported latency was actually observed.
    """
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def rate(count: float, seconds: float) -> float:
    """Events per second; 0 when no time passed."""
    return count / seconds if seconds > 0 else 0.0


@dataclass(frozen=True)
class LatencySummary:
    """Latency percentiles in milliseconds (NaN when there were no successful requests)."""

    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float

    @classmethod
    def of(cls, latencies_s: Sequence[float]) -> LatencySummary:
        """Summarise latencies given in seconds."""
        ms = [value * 1000 for value in latencies_s]
        return cls(
            count=len(ms),
            p50_ms=percentile(ms, 50),
            p95_ms=percentile(ms, 95),
            p99_ms=percentile(ms, 99),
            max_ms=max(ms) if ms else math.nan,
            mean_ms=sum(ms) / len(ms) if ms else math.nan,
        )


@dataclass
class PhaseResult:
    """What one target did in one measured phase (closed loop at N clients, or open loop)."""

    target: str
    mode: str
    concurrency: int | None
    offered_rate: float | None
    elapsed_s: float
    requests: int
    ok_requests: int
    ok_texts: int
    requests_per_s: float
    texts_per_s: float
    latency: LatencySummary
    errors: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    # Failed requests take time too (a refusal should be fast): their latencies, by error kind.
    error_latencies_ms: dict[str, list[float]] = field(default_factory=dict, repr=False)
    # Retry-After values seen on failed requests, and how often.
    retry_after: dict[str, int] = field(default_factory=dict)

    def failure_latency(self, *kinds: str) -> LatencySummary:
        """Latency percentiles of the requests that failed with any of ``kinds``."""
        return LatencySummary.of(
            [ms / 1000 for kind in kinds for ms in self.error_latencies_ms.get(kind, [])]
        )

    @property
    def label(self) -> str:
        """Short name of the phase, e.g. ``closed-c16`` or ``open-40rps``."""
        if self.mode == "closed":
            return f"closed-c{self.concurrency}"
        return f"open-{self.offered_rate:g}rps"

    def to_json(self, include_latencies: bool = True) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes null)."""
        data = asdict(self)
        data["label"] = self.label
        if not include_latencies:
            data.pop("latencies_ms")
            data.pop("error_latencies_ms")
        return cast(dict[str, Any], _nan_to_none(data))


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _nan_to_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(item) for item in value]
    return value


def summarize(
    samples: Sequence[Sample],
    *,
    target: str,
    mode: str,
    window_start: float,
    concurrency: int | None = None,
    offered_rate: float | None = None,
) -> PhaseResult:
    """Summarise the samples scheduled at or after ``window_start`` (earlier ones are warm-up).

    The elapsed time runs from ``window_start`` to the last completion, so requests still in
    flight at the end of the phase are paid for, not cut off.
    """
    measured = [sample for sample in samples if sample.scheduled >= window_start]
    ok = [sample for sample in measured if sample.error is None]
    last_end = max((sample.scheduled + sample.latency for sample in measured), default=window_start)
    elapsed = last_end - window_start
    errors: Counter[str] = Counter()
    error_latencies: dict[str, list[float]] = {}
    retry_after: Counter[str] = Counter()
    for sample in measured:
        if sample.error is not None:
            errors[sample.error] += 1
            error_latencies.setdefault(sample.error, []).append(sample.latency * 1000)
            if sample.retry_after is not None:
                retry_after[sample.retry_after] += 1
    ok_texts = sum(sample.texts for sample in ok)
    return PhaseResult(
        target=target,
        mode=mode,
        concurrency=concurrency,
        offered_rate=offered_rate,
        elapsed_s=elapsed,
        requests=len(measured),
        ok_requests=len(ok),
        ok_texts=ok_texts,
        requests_per_s=rate(len(ok), elapsed),
        texts_per_s=rate(ok_texts, elapsed),
        latency=LatencySummary.of([sample.latency for sample in ok]),
        errors=dict(sorted(errors.items())),
        latencies_ms=[sample.latency * 1000 for sample in ok],
        error_latencies_ms=dict(sorted(error_latencies.items())),
        retry_after=dict(sorted(retry_after.items())),
    )
