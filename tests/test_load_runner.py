"""The closed- and open-loop drivers against a fake target (no server, no timing assertions)."""

from __future__ import annotations

import asyncio

from load.runner import run_closed_loop, run_open_loop
from load.targets import RequestFailed, Target


class FakeTarget(Target):
    """Answers after a fixed delay; every third request fails."""

    def __init__(self, delay_s: float) -> None:
        self.name = "fake"
        self.delay_s = delay_s
        self.calls = 0

    async def score(self, texts: list[str]) -> None:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if self.calls % 3 == 0:
            raise RequestFailed("http_500")


REQUESTS = [["a"], ["b", "c"]]


async def test_closed_loop_stops_at_max_requests_and_counts_errors() -> None:
    target = FakeTarget(0.001)
    result = await run_closed_loop(target, REQUESTS, concurrency=3, duration_s=5.0, max_requests=30)
    # Each client checks the bound before sending, so at most concurrency-1 extra slip in.
    assert 30 <= result.requests <= 32
    assert result.errors.get("http_500", 0) > 0
    assert result.ok_requests + sum(result.errors.values()) == result.requests
    assert result.label == "closed-c3"


async def test_open_loop_drops_beyond_the_in_flight_bound() -> None:
    slow = FakeTarget(0.5)
    result = await run_open_loop(
        slow, REQUESTS, rate_per_s=400.0, duration_s=0.3, max_in_flight=2, seed=3
    )
    assert result.errors.get("dropped", 0) > 0
    assert result.requests == result.ok_requests + sum(result.errors.values())


async def test_open_loop_runs_to_its_duration_and_stops() -> None:
    target = FakeTarget(0.001)
    result = await run_open_loop(target, REQUESTS, rate_per_s=200.0, duration_s=0.3, warmup_s=0.1)
    assert result.requests > 0
    assert result.offered_rate == 200.0
