"""Closed-loop and open-loop drivers: bounded in time and in count, warm-up excluded.

Closed loop: N clients, each sends its next request when the previous one answers. It measures
capacity but hides queueing: a slow server slows the clients down (coordinated omission).

Open loop: arrivals follow a Poisson process at a fixed rate whatever the server does, and each
latency runs from the *scheduled* arrival, so time spent waiting behind a slow server counts.
In-flight requests are bounded; an arrival finding the bound reached is dropped and counted as
an error of kind ``dropped``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence

from load.stats import PhaseResult, Sample, summarize
from load.targets import RequestFailed, Target

Clock = Callable[[], float]
# A request that outlives its own client timeout by this much is abandoned and counted as one.
_GRACE_S = 5.0


async def _timed(
    target: Target, texts: list[str], scheduled: float, clock: Clock, timeout_s: float
) -> Sample:
    error: str | None = None
    retry_after: str | None = None
    try:
        await asyncio.wait_for(target.score(texts), timeout_s + _GRACE_S)
    except RequestFailed as failure:
        error, retry_after = failure.kind, failure.retry_after
    except asyncio.TimeoutError:
        error = "timeout"
    except Exception as failure:  # a load tool counts failures, never crashes
        error = f"exception_{type(failure).__name__}"
    return Sample(scheduled, clock() - scheduled, len(texts), error, retry_after)


async def time_one_request(target: Target, texts: list[str], timeout_s: float = 60.0) -> Sample:
    """Send one request on its own and time it (used for the first request after ready)."""
    clock = time.perf_counter
    return await _timed(target, texts, clock(), clock, timeout_s)


async def run_closed_loop(
    target: Target,
    requests: Sequence[list[str]],
    *,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.0,
    max_requests: int | None = None,
    timeout_s: float = 10.0,
    clock: Clock = time.perf_counter,
) -> PhaseResult:
    """``concurrency`` clients back to back: ``warmup_s``, then ``duration_s``/``max_requests``."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    start = clock()
    window_start = start + warmup_s
    end = window_start + duration_s
    samples: list[Sample] = []
    next_index = 0
    measured = 0

    async def client() -> None:
        nonlocal next_index, measured
        while True:
            now = clock()
            if now >= end or (max_requests is not None and measured >= max_requests):
                return
            texts = requests[next_index % len(requests)]
            next_index += 1
            if now >= window_start:
                measured += 1
            samples.append(await _timed(target, texts, now, clock, timeout_s))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return summarize(
        samples,
        target=target.name,
        mode="closed",
        window_start=window_start,
        concurrency=concurrency,
    )


async def run_open_loop(
    target: Target,
    requests: Sequence[list[str]],
    *,
    rate_per_s: float,
    duration_s: float,
    warmup_s: float = 0.0,
    max_requests: int | None = None,
    max_in_flight: int = 64,
    timeout_s: float = 10.0,
    seed: int = 0,
    clock: Clock = time.perf_counter,
    stop: asyncio.Event | None = None,
) -> PhaseResult:
    """Poisson arrivals at ``rate_per_s``: ``warmup_s``, then ``duration_s`` or ``max_requests``,
    or until ``stop`` is set (for a phase whose length depends on what happens meanwhile)."""
    if rate_per_s <= 0:
        raise ValueError("rate_per_s must be positive")
    arrivals = random.Random(seed)
    start = clock()
    window_start = start + warmup_s
    end = window_start + duration_s
    samples: list[Sample] = []
    in_flight: set[asyncio.Task[None]] = set()
    scheduled = start
    index = 0
    measured = 0

    async def send(texts: list[str], due: float) -> None:
        samples.append(await _timed(target, texts, due, clock, timeout_s))

    while True:
        scheduled += arrivals.expovariate(rate_per_s)
        if scheduled >= end or (max_requests is not None and measured >= max_requests):
            break
        delay = scheduled - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if stop is not None and stop.is_set():
            break
        # When the loop runs late, overdue arrivals go out at once; their latency still starts at
        # `scheduled`, so the lateness is charged to the measurement, not hidden.
        texts = requests[index % len(requests)]
        index += 1
        if scheduled >= window_start:
            measured += 1
        if len(in_flight) >= max_in_flight:
            samples.append(
                Sample(scheduled=scheduled, latency=0.0, texts=len(texts), error="dropped")
            )
            continue
        task = asyncio.create_task(send(texts, scheduled))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.gather(*in_flight)
    return summarize(
        samples, target=target.name, mode="open", window_start=window_start, offered_rate=rate_per_s
    )
