"""Admission control over a fake clock: the in-flight limit, the FIFO queue, fast refusals."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest
from prometheus_client import CollectorRegistry

from gateway import errors
from gateway.admission import RATE_WINDOW_S, AdmissionController, AdmissionLimits, DrainRate
from gateway.metrics import GatewayMetrics
from tests.unit.conftest import unit_gateway
from tests.unit.fake_triton import FakeTriton


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(
    clock: Clock, min_in_flight: int = 2, max_queue: int = 4, max_wait_s: float = 5.0
) -> AdmissionController:
    limits = AdmissionLimits(
        target_s=0.1,
        max_wait_s=max_wait_s,
        min_in_flight=min_in_flight,
        max_in_flight=100,
        max_queue=max_queue,
    )
    return AdmissionController("m", limits, GatewayMetrics(CollectorRegistry()), clock)


async def hold(stack: AsyncExitStack, admission: AdmissionController, texts: int) -> None:
    await stack.enter_async_context(admission.admit(texts, deadline=admission.clock() + 10))


async def test_requests_within_the_limit_are_admitted_at_once() -> None:
    admission = controller(Clock())
    async with AsyncExitStack() as stack:
        await hold(stack, admission, 1)
        await hold(stack, admission, 1)
        assert admission.in_flight == 2
    assert admission.in_flight == 0


async def test_waiters_are_granted_in_fifo_order_as_capacity_frees() -> None:
    admission = controller(Clock())
    order: list[str] = []

    async def request(name: str, release: asyncio.Event) -> None:
        async with admission.admit(1, deadline=admission.clock() + 10):
            order.append(name)
            await release.wait()

    releases = {name: asyncio.Event() for name in "abcd"}
    tasks = {name: asyncio.create_task(request(name, releases[name])) for name in "abcd"}
    await wait_until(lambda: order == ["a", "b"] and admission.queued == 2)
    releases["b"].set()
    await wait_until(lambda: order == ["a", "b", "c"])
    releases["a"].set()
    await wait_until(lambda: order == ["a", "b", "c", "d"])
    for event in releases.values():
        event.set()
    await asyncio.gather(*tasks.values())
    assert admission.in_flight == 0 and admission.queued == 0


async def test_a_full_queue_is_refused_at_once_with_retry_after() -> None:
    admission = controller(Clock(), max_queue=1)
    async with AsyncExitStack() as stack:
        await hold(stack, admission, 2)  # the limit (2) is taken
        waiting = asyncio.create_task(hold(stack, admission, 1))  # the queue (1) is taken
        await wait_until(lambda: admission.queued == 1)
        with pytest.raises(errors.Overloaded) as refused:
            await hold(stack, admission, 1)
        assert refused.value.status_code == 503
        assert int(refused.value.headers["Retry-After"]) >= 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert admission.queued == 0  # a cancelled waiter leaves the queue


async def saturate(admission: AdmissionController, clock: Clock) -> None:
    """Two texts finish 0.1 s apart while others wait: the measured rate is 10 texts/s."""
    first, second = AsyncExitStack(), AsyncExitStack()
    await hold(first, admission, 1)
    await hold(second, admission, 1)
    waiters = [asyncio.create_task(hold(AsyncExitStack(), admission, 1)) for _ in range(2)]
    await wait_until(lambda: admission.queued == 2)
    for stack in (first, second):
        clock.now += 0.1
        await stack.aclose()
    await asyncio.gather(*waiters)
    admission.in_flight = 0  # the waiters' stacks are never closed: drop their holds by hand


async def test_a_request_that_would_miss_its_deadline_is_refused_at_once() -> None:
    clock = Clock()
    admission = controller(clock)
    await saturate(admission, clock)
    assert admission._rate.per_second(clock()) == pytest.approx(10.0)
    async with AsyncExitStack() as stack:
        await hold(stack, admission, 2)
        # Ahead: 2 in flight at limit 2; its own 2 texts need about 2 / 10 = 0.2 s more.
        with pytest.raises(errors.Overloaded, match="would start"):
            await stack.enter_async_context(admission.admit(2, deadline=clock() + 0.1))
        assert admission.queued == 0


def test_one_completion_is_no_measurement_of_the_drain_rate() -> None:
    # A burst's first completion (1 text) once read as 1 text per 0.5 s and refused requests
    # 20 texts back as "would start in about 10.00 s" that were served in well under a second.
    rate = DrainRate()
    rate.record(1, 1000.0)
    assert rate.per_second(1000.01) == 0.0
    rate.record(1, 1000.02)  # the next one 20 ms later: 50 texts/s
    assert rate.per_second(1000.02) == pytest.approx(50.0)
    # A stall lowers the rate as time passes without completions.
    assert rate.per_second(1001.0) == pytest.approx(1.0)


async def test_completions_at_low_load_do_not_count_as_capacity() -> None:
    clock = Clock()
    admission = controller(clock)
    for _ in range(5):
        async with admission.admit(1, deadline=clock() + 10):
            clock.now += 0.01
    assert admission._rate.per_second(clock()) == 0.0


async def test_a_waiter_whose_wait_passes_max_wait_is_refused() -> None:
    admission = controller(Clock(), max_wait_s=0.05)
    async with AsyncExitStack() as stack:
        await hold(stack, admission, 2)
        with pytest.raises(errors.Overloaded, match="waited"):
            await hold(stack, admission, 1)
        assert admission.queued == 0


async def test_the_limit_follows_the_drain_rate_between_floor_and_ceiling() -> None:
    clock = Clock()
    admission = controller(clock, min_in_flight=2)
    assert admission.limit(clock()) == 2
    for _ in range(50):  # 500 texts in 1 s while saturated: 500 texts/s x 0.1 s target = 50
        clock.now += 0.02
        admission._rate.record(10, clock())
    assert admission.limit(clock()) == pytest.approx(50, abs=3)
    clock.now += RATE_WINDOW_S + 1  # idle: the measurement expires, the floor returns
    assert admission.limit(clock()) == 2


async def test_overload_through_the_app_is_a_503_with_retry_after() -> None:
    triton = FakeTriton()
    async with unit_gateway(triton, admission_min_in_flight=1, admission_max_queue=0) as gateway:
        triton.gate = asyncio.Event()  # Triton holds the first request
        first = asyncio.create_task(
            gateway.client.post("/v1/predict", json={"texts": ["a"]}, headers=gateway.auth)
        )
        await wait_until(lambda: len(triton.infer_calls()) == 1)
        refused = await gateway.client.post(
            "/v1/predict", json={"texts": ["b"]}, headers=gateway.auth
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "overloaded"
        assert int(refused.headers["retry-after"]) >= 1
        assert len(triton.infer_calls()) == 1  # the refused request never reached Triton
        triton.gate.set()
        assert (await first).status_code == 200
        metrics = (await gateway.client.get("/metrics")).text
        assert (
            'gateway_admission_decisions_total{model="text_regression_v1",outcome="refused_queue_full"} 1.0'
            in metrics
        )


async def wait_until(predicate: object, timeout_s: float = 5.0) -> None:
    """Yield to the loop until ``predicate()`` holds."""
    assert callable(predicate)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting for the condition")
        await asyncio.sleep(0.001)
