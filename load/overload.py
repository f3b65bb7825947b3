"""``python -m load overload``: what the gateway does when offered more than it can serve.

The tool starts its own stack (embedded Triton + a ``python -m gateway serve`` process, settings
through ``GATEWAY_*`` variables), then:

1. capacity: a short closed loop (``--capacity-concurrency`` clients), or ``--capacity`` as given;
2. normal latency: single requests one after the other, the p50 the recovery is judged by;
3. the burst: open-loop Poisson arrivals at ``factor`` x capacity for ``duration`` seconds;
4. recovery: from the end of the burst's arrivals, single requests one after the other until the
   median of the last ``window`` (all answered 200) is within ``tolerance`` x the normal p50.

It reports goodput (2xx texts/s) against capacity, the admitted requests' p50/p99, how fast
refusals (503/429) came and which Retry-After they carried, every status (504 and other 5xx apart
from refusals; ``dropped`` = the tool's own in-flight bound, not a server answer), the gateway's
resident memory before, at peak and after, and how long p50 took to return to normal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devtools.process import memory_kib
from load.compare import DEFAULT_RESULTS
from load.report import config_json, fmt, machine, markdown_table, run_directory, save_run
from load.runner import Clock, run_closed_loop, run_open_loop, time_one_request
from load.stack import GatewayProcess, embedded_triton, gateway_process
from load.stats import PhaseResult, percentile
from load.targets import HttpTarget, Target
from load.workload import TextMix, make_requests, typical_request

log = logging.getLogger("load")

REFUSALS = ("http_503", "http_429")


@dataclass
class OverloadConfig:
    """Everything ``python -m load overload`` is told."""

    repository: Path
    results_dir: Path = DEFAULT_RESULTS
    factor: float = 4.0
    duration_s: float = 60.0
    # Requests/s the stack can serve; measured with a closed loop when None.
    capacity: float | None = None
    capacity_concurrency: int = 16
    capacity_s: float = 10.0
    warmup_s: float = 3.0
    probes: int = 20
    window: int = 5
    tolerance: float = 1.5
    recovery_timeout_s: float = 120.0
    # The tool's own bound on requests in flight (and its connection pool): far above what the
    # server can take, so that the server, not the client, decides what happens to the excess.
    max_in_flight: int = 1024
    # Above the gateway's own deadline (GATEWAY_REQUEST_TIMEOUT_S, 10 s): its answer is what counts.
    timeout_s: float = 30.0
    texts_per_request: int = 1
    request_pool: int = 2000
    mix: TextMix = field(default_factory=TextMix)
    seed: int = 0


@dataclass(frozen=True)
class Probe:
    """One single request sent after the burst: when (s after its arrivals ended), how it went."""

    sent_after_s: float
    latency_ms: float
    error: str | None


def status_groups(phase: PhaseResult) -> dict[str, int]:
    """The phase's requests by outcome: 2xx, refused (503/429), 504, other 5xx, the rest."""
    groups: Counter[str] = Counter({"2xx": phase.ok_requests})
    for kind, count in phase.errors.items():
        if kind in REFUSALS:
            groups["refused (503/429)"] += count
        elif kind == "http_504":
            groups["504"] += count
        elif kind.startswith("http_5"):
            groups["other 5xx"] += count
        elif kind.startswith("http_"):
            groups["other HTTP"] += count
        else:  # timeout, connection, dropped: the client's side of things
            groups[f"client: {kind}"] += count
    return dict(groups)


async def probe_until_normal(
    target: Target,
    request: list[str],
    normal_p50_ms: float,
    *,
    since: float,
    window: int = 5,
    tolerance: float = 1.5,
    timeout_s: float = 60.0,
    request_timeout_s: float = 30.0,
    clock: Clock = time.perf_counter,
) -> tuple[list[Probe], float | None]:
    """Send ``request`` alone, again and again, until the p50 of the last ``window`` (all OK) is
    at most ``tolerance`` x ``normal_p50_ms``, or ``timeout_s`` after ``since``.

    Returns the probes and when p50 was back (seconds after ``since``): the send time of the
    first probe of that window that was itself within the threshold (a slow first probe of the
    window does not count as back). None if p50 never came back.
    """
    threshold = tolerance * normal_p50_ms
    probes: list[Probe] = []
    while clock() < since + timeout_s:
        sent = clock()
        sample = await time_one_request(target, request, timeout_s=request_timeout_s)
        probes.append(Probe(sent - since, sample.latency * 1000, sample.error))
        last = probes[-window:]
        if (
            len(last) == window
            and all(probe.error is None for probe in last)
            and percentile([probe.latency_ms for probe in last], 50) <= threshold
        ):
            return probes, next(p.sent_after_s for p in last if p.latency_ms <= threshold)
    return probes, None


async def run_overload(config: OverloadConfig) -> dict[str, Any]:
    """Start the stack, run the four steps, stop it; write JSON and markdown under ``results_dir``."""
    stamp, run_dir = run_directory(config.results_dir, "overload")
    workdir = run_dir / "work"
    server = embedded_triton(config.repository, workdir)
    log.info("triton: starting the embedded server")
    await asyncio.to_thread(server.start)
    try:
        gateway = gateway_process(
            server.grpc_url, workdir, max_texts_per_request=config.texts_per_request
        )
        log.info("gateway: starting on %s", gateway.base_url)
        await asyncio.to_thread(gateway.server.start)
        try:
            measured = await _measure(config, gateway)
        finally:
            await asyncio.to_thread(gateway.server.stop)
    finally:
        await asyncio.to_thread(server.stop)
    document = {
        "kind": "overload",
        "started": stamp,
        "machine": machine(),
        "config": config_json(config),
        **measured,
    }
    return save_run(run_dir, document, overload_markdown(document))


async def _measure(config: OverloadConfig, gateway: GatewayProcess) -> dict[str, Any]:
    requests = make_requests(config.request_pool, config.texts_per_request, config.mix)
    probe_request = typical_request(config.texts_per_request, config.mix)
    target = HttpTarget(
        "gateway",
        gateway.base_url,
        gateway.api_key,
        timeout_s=config.timeout_s,
        max_connections=config.max_in_flight,
    )
    # Probes get their own connection: they must not queue in the burst's pool on our side.
    prober = HttpTarget("probe", gateway.base_url, gateway.api_key, config.timeout_s, 1)
    await target.open()
    await prober.open()
    try:
        capacity_phase = None
        capacity = config.capacity
        if capacity is None:
            log.info("capacity: closed loop, %d clients", config.capacity_concurrency)
            capacity_phase = await run_closed_loop(
                target,
                requests,
                concurrency=config.capacity_concurrency,
                duration_s=config.capacity_s,
                warmup_s=config.warmup_s,
                timeout_s=config.timeout_s,
            )
            capacity = capacity_phase.requests_per_s
            if capacity <= 0:
                raise RuntimeError(f"the capacity run served nothing: {capacity_phase.errors}")
        before = [
            await time_one_request(prober, probe_request, config.timeout_s)
            for _ in range(config.probes)
        ]
        normal_p50_ms = percentile([s.latency * 1000 for s in before if s.error is None], 50)
        assert gateway.pid is not None
        memory_before = memory_kib(gateway.pid)
        rate = config.factor * capacity
        log.info("burst: %.1f requests/s (%.1f x %.1f) for %.0f s", rate, config.factor,
                 capacity, config.duration_s)  # fmt: skip
        started = time.perf_counter()
        burst = asyncio.create_task(
            run_open_loop(
                target,
                requests,
                rate_per_s=rate,
                duration_s=config.duration_s,
                max_in_flight=config.max_in_flight,
                timeout_s=config.timeout_s,
                seed=config.seed,
            )
        )
        arrivals_end = started + config.duration_s
        await asyncio.sleep(max(0.0, arrivals_end - time.perf_counter()))
        log.info("recovery: probing until p50 is within %.1f x %.1f ms", config.tolerance,
                 normal_p50_ms)  # fmt: skip
        probes, recovered_after_s = await probe_until_normal(
            prober,
            probe_request,
            normal_p50_ms,
            since=arrivals_end,
            window=config.window,
            tolerance=config.tolerance,
            timeout_s=config.recovery_timeout_s,
            request_timeout_s=config.timeout_s,
        )
        phase = await burst
        memory_after = memory_kib(gateway.pid)
    finally:
        await target.close()
        await prober.close()
    capacity_texts = (
        capacity_phase.texts_per_s if capacity_phase else capacity * config.texts_per_request
    )
    refused = phase.failure_latency(*REFUSALS)
    return {
        "capacity": {
            "requests_per_s": capacity,
            "texts_per_s": capacity_texts,
            "measured": capacity_phase.to_json(include_latencies=False) if capacity_phase else None,
        },
        "offered_rate_per_s": rate,
        "burst": phase.to_json(include_latencies=False),
        "goodput_texts_per_s": phase.texts_per_s,
        "goodput_over_capacity": phase.texts_per_s / capacity_texts if capacity_texts else None,
        "admitted_latency": asdict(phase.latency),
        "refused_latency": asdict(refused),
        "retry_after": phase.retry_after,
        "statuses": status_groups(phase),
        "gateway_memory_kib": {
            "rss_before": memory_before.get("VmRSS"),
            "rss_after": memory_after.get("VmRSS"),
            "rss_peak": memory_after.get("VmHWM"),
        },
        "recovery": {
            "normal_p50_ms": normal_p50_ms,
            "threshold_ms": config.tolerance * normal_p50_ms,
            "window": config.window,
            "p50_normal_after_s": recovered_after_s,
            "probes": [asdict(probe) for probe in probes],
        },
    }


def overload_markdown(document: dict[str, Any]) -> str:
    """The run's figures as a markdown table (the shape docs/benchmarks.md records)."""
    capacity, burst = document["capacity"], document["burst"]
    admitted, refused = document["admitted_latency"], document["refused_latency"]
    memory, recovery = document["gateway_memory_kib"], document["recovery"]
    config = document["config"]

    def mib(kib: int | None) -> str:
        return fmt(kib / 1024) if kib is not None else "n/a"

    retry_after = ", ".join(f"{value} s: {n}" for value, n in document["retry_after"].items())
    statuses = ", ".join(f"{name}: {n}" for name, n in document["statuses"].items())
    errors = ", ".join(f"{kind}: {n}" for kind, n in burst["errors"].items()) or "none"
    recovered = recovery["p50_normal_after_s"]
    rows = [
        ("capacity (closed loop)" if capacity["measured"] else "capacity (given)",
         f"{fmt(capacity['requests_per_s'])} req/s, {fmt(capacity['texts_per_s'])} texts/s"),
        ("offered (open loop, Poisson)",
         f"{fmt(document['offered_rate_per_s'])} req/s = {config['factor']:g} x capacity, "
         f"{config['duration_s']:g} s"),
        ("goodput (2xx texts/s)",
         f"{fmt(document['goodput_texts_per_s'])} = "
         f"{fmt(document['goodput_over_capacity'], 2)} x capacity"),
        ("admitted (2xx) latency p50 / p99 / max ms",
         f"{fmt(admitted['p50_ms'])} / {fmt(admitted['p99_ms'])} / {fmt(admitted['max_ms'])}"),
        ("refused (503/429) latency p50 / p99 / max ms",
         f"{fmt(refused['p50_ms'])} / {fmt(refused['p99_ms'])} / {fmt(refused['max_ms'])}"
         f" ({refused['count']} refusals)"),
        ("Retry-After seen", retry_after or "none"),
        ("requests by outcome", f"{burst['requests']} sent: {statuses}"),
        ("errors by kind", errors),
        ("gateway RSS before / peak / after MiB",
         f"{mib(memory['rss_before'])} / {mib(memory['rss_peak'])} / {mib(memory['rss_after'])}"),
        ("normal p50 (single requests before the burst)", f"{fmt(recovery['normal_p50_ms'])} ms"),
        (f"p50 of {recovery['window']} single requests back within "
         f"{fmt(recovery['threshold_ms'])} ms",
         f"{fmt(recovered)} s after the burst's arrivals ended" if recovered is not None
         else f"not within the recovery timeout ({len(recovery['probes'])} probes)"),
    ]  # fmt: skip
    return "### Overload\n\n" + markdown_table(("measure", "value"), rows) + "\n"
