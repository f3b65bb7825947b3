"""One run, one machine, every target: raw in-process, naive baseline, Triton, and the gateway.

Order matters on a small machine: the raw benchmark runs first, with no server alive; then each
server is started, measured and stopped before the next one starts, so no two compete for the
CPU. Every target receives the same requests (same seed).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.triton import EmbeddedTriton
from load.baseline import baseline_server
from load.engine import DEFAULT_TORCH_THREADS
from load.raw import DEFAULT_BATCH_SIZES, RawResult, run_raw_benchmark
from load.report import (
    ColdStart,
    TargetReport,
    config_json,
    machine,
    markdown,
    plot,
    ratio_rows,
    run_directory,
    save_run,
)
from load.runner import run_closed_loop, run_open_loop, time_one_request
from load.stack import embedded_triton, gateway_process
from load.targets import HttpTarget, Target, TritonGrpcTarget
from load.workload import TextMix, make_requests, typical_request

log = logging.getLogger("load")

DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"
# Open loop, when no rate is given: this fraction of the baseline's closed-loop capacity, i.e. a
# load every target should sustain, where p99 shows queueing rather than overload.
DEFAULT_OPEN_FRACTION = 0.7


@dataclass
class PhasePlan:
    """How each target is driven: the same for every target of one run."""

    concurrencies: Sequence[int] = (1, 16)
    duration_s: float = 30.0
    warmup_s: float = 5.0
    max_requests: int | None = None
    open_rate: float | None = None
    open_fraction: float = DEFAULT_OPEN_FRACTION
    run_open_loop: bool = True
    max_in_flight: int = 64
    timeout_s: float = 10.0
    seed: int = 0


@dataclass
class CompareConfig:
    """Everything ``python -m load compare`` is told."""

    repository: Path
    results_dir: Path = DEFAULT_RESULTS
    plan: PhasePlan = field(default_factory=PhasePlan)
    texts_per_request: int = 1
    request_pool: int = 2000
    mix: TextMix = field(default_factory=TextMix)
    raw_batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES
    raw_seconds: float = 10.0
    raw_max_texts: int | None = None
    torch_threads: int = DEFAULT_TORCH_THREADS
    targets: Sequence[str] = ("raw", "baseline", "triton", "gateway")
    triton_url: str | None = None
    gateway_url: str | None = None
    gateway_key: str | None = None


async def measure_target(
    target: Target,
    requests: Sequence[list[str]],
    plan: PhasePlan,
    *,
    probe: list[str] | None = None,
    ready_after_s: float | None = None,
    open_rate: float | None = None,
) -> TargetReport:
    """Drive one target through every phase of ``plan``.

    With ``probe``, the very first request (right after the server reported ready) is timed on its
    own and compared with the steady p50 at the lowest concurrency.
    """
    report = TargetReport(target.name)
    await target.open()
    try:
        if probe is not None:
            first = await time_one_request(target, probe, timeout_s=max(plan.timeout_s, 60.0))
            report.cold_start = ColdStart(ready_after_s, first.latency * 1000, first.error)
        for concurrency in plan.concurrencies:
            log.info(
                "%s: closed loop, %d clients, %.0f s", target.name, concurrency, plan.duration_s
            )
            report.phases.append(
                await run_closed_loop(
                    target,
                    requests,
                    concurrency=concurrency,
                    duration_s=plan.duration_s,
                    warmup_s=plan.warmup_s,
                    max_requests=plan.max_requests,
                    timeout_s=plan.timeout_s,
                )
            )
        # Without a given rate, the first target measured sets it from its own capacity, and
        # every later target is offered that same rate.
        rate = open_rate or plan.open_rate or _auto_open_rate(plan, [report])
        if plan.run_open_loop and rate:
            log.info("%s: open loop, %.1f requests/s, %.0f s", target.name, rate, plan.duration_s)
            report.phases.append(
                await run_open_loop(
                    target,
                    requests,
                    rate_per_s=rate,
                    duration_s=plan.duration_s,
                    warmup_s=plan.warmup_s,
                    max_requests=plan.max_requests,
                    max_in_flight=plan.max_in_flight,
                    timeout_s=plan.timeout_s,
                    seed=plan.seed,
                )
            )
    finally:
        await target.close()
    if report.cold_start is not None and plan.concurrencies:
        steady = report.phase("closed", min(plan.concurrencies))
        if steady is not None:
            report.cold_start.steady_p50_ms = steady.latency.p50_ms
    return report


def _auto_open_rate(plan: PhasePlan, reports: Sequence[TargetReport]) -> float | None:
    if plan.open_rate:
        return plan.open_rate
    for report in reports:
        phase = report.phase("closed", max(plan.concurrencies)) if plan.concurrencies else None
        if phase is not None and phase.requests_per_s > 0:
            return round(phase.requests_per_s * plan.open_fraction, 1)
    return None


def _offered_rate(reports: Sequence[TargetReport]) -> float | None:
    for report in reports:
        phase = report.phase("open")
        if phase is not None:
            return phase.offered_rate
    return None


async def run_baseline(
    config: CompareConfig, requests: Sequence[list[str]], probe: list[str], workdir: Path
) -> TargetReport:
    """Start the baseline server, measure it (cold start included), stop it."""
    api_key = secrets.token_urlsafe(24)
    server, base_url = baseline_server(
        config.repository, api_key, workdir, torch_threads=config.torch_threads
    )
    log.info("baseline: starting on %s", base_url)
    await asyncio.to_thread(server.start)
    try:
        log.info("baseline: ready after %.2f s", server.ready_after or 0)
        target = HttpTarget("baseline", base_url, api_key, timeout_s=config.plan.timeout_s)
        return await measure_target(
            target, requests, config.plan, probe=probe, ready_after_s=server.ready_after
        )
    finally:
        await asyncio.to_thread(server.stop)


async def run_stack(
    config: CompareConfig,
    requests: Sequence[list[str]],
    probe: list[str],
    workdir: Path,
    open_rate: float | None,
) -> list[TargetReport]:
    """Measure Triton over gRPC, then the gateway in front of that same Triton.

    Servers given by URL are used as they are. Otherwise an embedded Triton (CPU profile, its own
    defaults) is started here and, when the gateway is a target, a real ``python -m gateway serve``
    process in front of it, started only after Triton's phases so the two are never measured at once.
    """
    reports: list[TargetReport] = []
    server: EmbeddedTriton | None = None
    triton_url = config.triton_url
    if triton_url is None and {"triton", "gateway"} & set(config.targets):
        server = embedded_triton(config.repository, workdir)
        log.info("triton: starting the embedded server")
        await asyncio.to_thread(server.start)
        triton_url = server.grpc_url
        log.info("triton: ready after %.2f s on %s", server.ready_after or 0, triton_url)
    try:
        if "triton" in config.targets and triton_url is not None:
            reports.append(
                await measure_target(
                    TritonGrpcTarget(triton_url, timeout_s=config.plan.timeout_s),
                    requests,
                    config.plan,
                    probe=probe if server is not None else None,
                    ready_after_s=server.ready_after if server is not None else None,
                    open_rate=open_rate,
                )
            )
            open_rate = open_rate or _offered_rate(reports)
        if "gateway" in config.targets:
            if config.gateway_url:
                given = HttpTarget(
                    "gateway", config.gateway_url, config.gateway_key or "", config.plan.timeout_s
                )
                reports.append(
                    await measure_target(given, requests, config.plan, open_rate=open_rate)
                )
            elif triton_url is not None:
                reports.append(
                    await _run_gateway(config, requests, probe, workdir, triton_url, open_rate)
                )
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
    return reports


async def _run_gateway(
    config: CompareConfig,
    requests: Sequence[list[str]],
    probe: list[str],
    workdir: Path,
    triton_url: str,
    open_rate: float | None,
) -> TargetReport:
    """Start ``python -m gateway serve`` in front of ``triton_url``, measure it, stop it."""
    gateway = gateway_process(triton_url, workdir, max_texts_per_request=config.texts_per_request)
    log.info("gateway: starting on %s", gateway.base_url)
    await asyncio.to_thread(gateway.server.start)
    try:
        log.info("gateway: ready after %.2f s", gateway.server.ready_after or 0)
        target = HttpTarget(
            "gateway", gateway.base_url, gateway.api_key, timeout_s=config.plan.timeout_s
        )
        return await measure_target(
            target,
            requests,
            config.plan,
            probe=probe,
            ready_after_s=gateway.server.ready_after,
            open_rate=open_rate,
        )
    finally:
        await asyncio.to_thread(gateway.server.stop)


async def run_compare(config: CompareConfig) -> dict[str, Any]:
    """Run every selected target; write JSON, PNG and markdown under ``results_dir``."""
    stamp, run_dir = run_directory(config.results_dir, "compare")
    workdir = run_dir / "work"
    requests = make_requests(config.request_pool, config.texts_per_request, config.mix)
    probe = typical_request(config.texts_per_request, config.mix)
    raw: list[RawResult] = []
    reports: list[TargetReport] = []

    if "raw" in config.targets:
        log.info("raw: in-process pipeline at batch sizes %s", list(config.raw_batch_sizes))
        raw_texts = [text for request in requests for text in request]
        raw = await asyncio.to_thread(
            run_raw_benchmark,
            config.repository,
            raw_texts,
            config.raw_batch_sizes,
            config.raw_seconds,
            config.raw_max_texts,
            config.torch_threads,
        )
    if "baseline" in config.targets:
        reports.append(await run_baseline(config, requests, probe, workdir))
    reports.extend(await run_stack(config, requests, probe, workdir, _offered_rate(reports)))
    open_rate = _offered_rate(reports)

    plan = config.plan
    low, high = (min(plan.concurrencies), max(plan.concurrencies)) if plan.concurrencies else (1, 1)
    rows = ratio_rows(reports, raw, low, high)
    document = {
        "kind": "compare",
        "started": stamp,
        "machine": machine(),
        "config": _config_json(config),
        "open_rate_per_s": open_rate,
        "raw": [result.to_json() for result in raw],
        "targets": [report.to_json() for report in reports],
        "ratios": [row.to_json() for row in rows],
    }
    saved = save_run(run_dir, document, markdown(reports, raw, rows))
    plot(
        run_dir / "results.png",
        reports,
        raw,
        f"{config.texts_per_request} text(s)/request, realistic mix, {plan.duration_s:g} s/phase",
    )
    return saved


def _config_json(config: CompareConfig) -> dict[str, Any]:
    data = config_json(config)
    data.pop("gateway_key", None)  # never write a key to disk
    return data
