"""``python -m load overload`` and ``python -m load chaos``: their parts over fakes, then smoke runs
against a real stack (tiny durations; those tests are ``triton`` through their fixtures)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from load.chaos import ChaosConfig, run_chaos
from load.overload import OverloadConfig, probe_until_normal, run_overload, status_groups
from load.runner import run_open_loop
from load.stats import Sample, summarize
from load.targets import RequestFailed, Target


class SlowThenFast(Target):
    """Answers slowly for its first ``slow`` calls (the backlog), then fast; or refuses."""

    def __init__(self, slow: int, refuse: int = 0) -> None:
        self.name = "fake"
        self.slow, self.refuse = slow, refuse
        self.calls = 0

    async def score(self, texts: list[str]) -> None:
        self.calls += 1
        if self.calls <= self.refuse:
            raise RequestFailed("http_503", "not ready", retry_after="1")
        await asyncio.sleep(0.1 if self.calls <= self.slow else 0.001)


async def test_probes_stop_once_a_whole_window_is_back_to_normal() -> None:
    target = SlowThenFast(slow=4, refuse=2)
    probes, recovered = await probe_until_normal(
        target, ["x"], normal_p50_ms=20.0, since=asyncio.get_running_loop().time(), window=3,
        timeout_s=10.0, clock=asyncio.get_running_loop().time,
    )  # fmt: skip
    # 2 refusals, 2 slow answers, then fast ones: the first window whose median is back to
    # normal and that holds no error is probes 4-6 (slow, fast, fast); p50 was back from the
    # first fast one on.
    assert [probe.error for probe in probes[:2]] == ["http_503", "http_503"]
    assert len(probes) == 6
    assert recovered == probes[4].sent_after_s


async def test_probes_give_up_after_their_timeout() -> None:
    target = SlowThenFast(slow=10_000)
    loop = asyncio.get_running_loop()
    probes, recovered = await probe_until_normal(
        target, ["x"], normal_p50_ms=5.0, since=loop.time(), timeout_s=0.2, clock=loop.time
    )
    assert recovered is None and probes


def test_outcomes_are_grouped_refusals_apart_from_504_and_other_5xx() -> None:
    samples = [
        Sample(0.0, 0.01, 1),
        Sample(0.0, 0.002, 1, "http_503", "1"),
        Sample(0.0, 0.004, 1, "http_429", "2"),
        Sample(0.0, 0.003, 1, "http_503", "1"),
        Sample(0.0, 10.0, 1, "http_504"),
        Sample(0.0, 0.1, 1, "http_500"),
        Sample(0.0, 0.0, 1, "dropped"),
    ]
    phase = summarize(samples, target="gateway", mode="open", window_start=0.0, offered_rate=7.0)
    assert status_groups(phase) == {
        "2xx": 1,
        "refused (503/429)": 3,
        "504": 1,
        "other 5xx": 1,
        "client: dropped": 1,
    }
    assert phase.retry_after == {"1": 2, "2": 1}
    refused = phase.failure_latency("http_503", "http_429")
    assert refused.count == 3 and refused.max_ms == 4.0 and refused.p50_ms == 3.0
    assert "error_latencies_ms" not in phase.to_json(include_latencies=False)


async def test_open_loop_stops_early_when_told() -> None:
    target = SlowThenFast(slow=0)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, stop.set)
    started = asyncio.get_running_loop().time()
    result = await run_open_loop(target, [["a"]], rate_per_s=100.0, duration_s=30.0, stop=stop)
    assert asyncio.get_running_loop().time() - started < 2
    assert 0 < result.requests < 100


# --- smoke runs against a real stack --------------------------------------------------------


async def test_overload_smoke(built_repository: Path, tmp_path: Path) -> None:
    config = OverloadConfig(
        repository=built_repository,
        results_dir=tmp_path,
        factor=2.0,
        duration_s=2.0,
        capacity_concurrency=4,
        capacity_s=1.5,
        warmup_s=0.3,
        probes=3,
        window=2,
        tolerance=3.0,
        recovery_timeout_s=30.0,
        request_pool=50,
    )
    document = await run_overload(config)
    saved = json.loads((Path(document["run_dir"]) / "results.json").read_text())
    assert saved["capacity"]["requests_per_s"] > 0 and saved["capacity"]["measured"]
    assert saved["offered_rate_per_s"] == 2.0 * saved["capacity"]["requests_per_s"]
    assert sum(saved["statuses"].values()) == saved["burst"]["requests"] > 0
    memory = saved["gateway_memory_kib"]
    assert memory["rss_before"] > 0 and memory["rss_peak"] >= memory["rss_after"] > 0
    assert saved["recovery"]["probes"] and saved["recovery"]["normal_p50_ms"] > 0
    assert "| goodput (2xx texts/s) |" in document["markdown"]


async def test_chaos_smoke(built_repository: Path, tmp_path: Path) -> None:
    config = ChaosConfig(
        repository=built_repository,
        results_dir=tmp_path,
        kills=1,
        rate=5.0,
        steady_s=1.5,
        recovery_timeout_s=90.0,
        request_pool=50,
    )
    document = await run_chaos(config)
    saved = json.loads((Path(document["run_dir"]) / "results.json").read_text())
    assert saved["hung_requests"] == 0
    [kill] = saved["kills"]
    assert kill["readiness_dropped_s"] is not None and kill["ready_again_s"] is not None
    assert kill["triton_start_to_ready_s"] > 0 and kill["backoff_s"] == 0.5
    assert kill["orphans"] == 0 and kill["restart_error"] is None
    assert saved["orphan_processes_at_end"] == [] and saved["leaked_shm_at_end"] == []
    assert saved["load"]["ok_requests"] > 0
    assert "| hung requests" in document["markdown"]
