"""Smoke runs of every target, a few seconds each: Triton over gRPC, the baseline over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools.triton import EmbeddedTriton
from load.baseline import baseline_server
from load.compare import CompareConfig, PhasePlan, measure_target, run_compare
from load.raw import run_raw_benchmark
from load.targets import HttpTarget, RequestFailed, TritonGrpcTarget
from load.workload import TextMix, make_requests, make_texts, typical_request

SMOKE_PLAN = PhasePlan(
    concurrencies=(1, 4), duration_s=1.0, warmup_s=0.3, max_requests=40, open_rate=10.0
)
REQUESTS = make_requests(50, 2, TextMix(seed=5))


async def test_triton_target_smoke(triton: EmbeddedTriton) -> None:
    target = TritonGrpcTarget(triton.grpc_url)
    report = await measure_target(
        target, REQUESTS, SMOKE_PLAN, probe=typical_request(2), ready_after_s=triton.ready_after
    )
    assert [phase.label for phase in report.phases] == ["closed-c1", "closed-c4", "open-10rps"]
    for phase in report.phases:
        assert phase.errors == {}
        assert phase.ok_requests > 0
    assert report.cold_start is not None and report.cold_start.first_request_error is None


def test_targets_refuse_remote_hosts() -> None:
    with pytest.raises(ValueError, match=r"127\.0\.0\.1"):
        HttpTarget("gateway", "http://example.com", "key")
    with pytest.raises(ValueError, match=r"127\.0\.0\.1"):
        TritonGrpcTarget("10.0.0.1:8001")


async def test_baseline_and_http_target_smoke(built_repository: Path, tmp_path: Path) -> None:
    server, base_url = baseline_server(built_repository, "smoke-key", tmp_path)
    server.start()
    try:
        assert server.ready_after is not None
        target = HttpTarget("baseline", base_url, "smoke-key")
        report = await measure_target(target, REQUESTS, SMOKE_PLAN, probe=typical_request(2))
        for phase in report.phases:
            assert phase.errors == {}
            assert phase.ok_texts == 2 * phase.ok_requests
        # The same contract as the gateway: a wrong key is refused.
        wrong = HttpTarget("baseline", base_url, "not-the-key")
        await wrong.open()
        try:
            with pytest.raises(RequestFailed) as failure:
                await wrong.score(["hello"])
            assert failure.value.kind == "http_401"
        finally:
            await wrong.close()
    finally:
        assert server.stop() is not None
    assert server.process is not None and server.process.poll() is not None


def test_raw_benchmark_smoke(built_repository: Path) -> None:
    results = run_raw_benchmark(
        built_repository, make_texts(40), batch_sizes=(1, 8), seconds_per_size=0.2
    )
    assert [result.batch_size for result in results] == [1, 8]
    assert all(result.texts_per_s > 0 for result in results)


async def test_compare_writes_json_png_and_table(
    built_repository: Path, triton: EmbeddedTriton, tmp_path: Path
) -> None:
    # Triton is the session's server (--triton-url); raw, baseline and a gateway in front of
    # that Triton are started by the tool.
    config = CompareConfig(
        repository=built_repository,
        results_dir=tmp_path,
        plan=PhasePlan(concurrencies=(1, 2), duration_s=0.8, warmup_s=0.2, max_requests=20),
        request_pool=30,
        raw_batch_sizes=(1, 4),
        raw_seconds=0.2,
        triton_url=triton.grpc_url,
    )
    document = await run_compare(config)
    run_dir = Path(document["run_dir"])
    saved = json.loads((run_dir / "results.json").read_text())
    assert [target["name"] for target in saved["targets"]] == ["baseline", "triton", "gateway"]
    gateway = saved["targets"][2]
    assert gateway["cold_start"]["ready_after_s"] > 0
    assert (run_dir / "results.png").stat().st_size > 10_000
    assert "| comparison |" in document["markdown"]
    assert "raw in-process best" in document["markdown"]
