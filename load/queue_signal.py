"""``python -m load.queue_signal``: Triton's queue time per request against load, on one replica.

The Helm chart scales on this signal (docs/kubernetes.md):

    queue µs per request = Δ sum(nv_inference_queue_duration_us{model in the ensembles' steps})
                         / Δ sum(nv_inference_request_success{model in the ensembles})

This serves the CPU profile in an embedded Triton (the server of ``make run``), drives
``text_regression_v1`` over gRPC with the realistic text mix at each Poisson rate and then closed
loop, reads Triton's metrics just before and just after each measured window, and prints one
table row per phase: the rate served, p50/p99, and the signal. It is the measurement the
autoscaling target of the chart was chosen from.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import urllib.request
from pathlib import Path

from build_models.pipeline import DEFAULT_REPOSITORY
from build_models.profiles import COMPOSING_MODELS, ENSEMBLES, render_repository, served_names
from devtools.triton import EmbeddedTriton
from load.runner import run_closed_loop, run_open_loop
from load.stats import PhaseResult
from load.targets import TritonGrpcTarget
from load.workload import make_requests

SAMPLE = re.compile(r'^(nv_inference_\w+)\{[^}]*model="([^"]+)"[^}]*\}\s+(\S+)$', re.M)
# The rendered repository serves the built pipeline version 1: these are its Triton names.
V1_NAMES = served_names(1, {"preprocess": 1, "bert": 1, "forest": 1})


def counters(metrics_url: str) -> dict[tuple[str, str], float]:
    """Triton's per-model counters now: (metric, model) -> value."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return {(name, model): float(value) for name, model, value in SAMPLE.findall(text)}


def queue_us_per_request(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
) -> float:
    """The chart's signal between two readings (0 when no request was answered)."""

    def delta(metric: str, models: tuple[str, ...]) -> float:
        return sum(after.get((metric, m), 0.0) - before.get((metric, m), 0.0) for m in models)

    answered = delta("nv_inference_request_success", tuple(V1_NAMES[m] for m in ENSEMBLES))
    waited = delta("nv_inference_queue_duration_us", tuple(V1_NAMES[m] for m in COMPOSING_MODELS))
    return waited / answered if answered else 0.0


async def measure(
    server: EmbeddedTriton, rates: list[float], concurrency: list[int], seconds: float
) -> list[str]:
    """One table row per phase; a short unmeasured run before each lets queues settle."""
    target = TritonGrpcTarget(server.grpc_url, timeout_s=30)
    requests = make_requests(2000, 1)
    rows = []
    await target.open()
    try:
        phases: list[tuple[str, float | int]] = [("open", rate) for rate in rates]
        phases += [("closed", clients) for clients in concurrency]
        for mode, level in phases:
            result: PhaseResult
            if mode == "open":
                await run_open_loop(target, requests, rate_per_s=float(level), duration_s=3)
                before = counters(server.metrics_url)
                result = await run_open_loop(
                    target, requests, rate_per_s=float(level), duration_s=seconds, timeout_s=30
                )
                label = f"Poisson {level:g} req/s"
            else:
                await run_closed_loop(target, requests, concurrency=int(level), duration_s=3)
                before = counters(server.metrics_url)
                result = await run_closed_loop(
                    target, requests, concurrency=int(level), duration_s=seconds, timeout_s=30
                )
                label = f"closed, {level} clients"
            signal = queue_us_per_request(before, counters(server.metrics_url))
            errors = sum(result.errors.values())
            # The machine's 1-minute load average after the phase: above its core count, something
            # else competed for the CPU and the row understates the replica.
            load = os.getloadavg()[0]
            rows.append(
                f"| {label} | {result.requests_per_s:.1f} | {result.latency.p50_ms:.1f} | "
                f"{result.latency.p99_ms:.1f} | {signal / 1000:.1f} | {errors} | {load:.1f} |"
            )
            print(rows[-1], flush=True)
    finally:
        await target.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Serve the CPU profile, load it phase by phase, print the table."""
    parser = argparse.ArgumentParser(prog="python -m load.queue_signal", description=__doc__)
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--rates", default="15,30,45,60,75", help="Poisson requests/s")
    parser.add_argument("--concurrency", default="16", help="closed-loop clients")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per phase")
    args = parser.parse_args(argv)
    rates = [float(rate) for rate in args.rates.split(",") if rate]
    clients = [int(count) for count in args.concurrency.split(",") if count]
    print("text_regression_v1 over gRPC, CPU profile, realistic mix, 1 text/request\n")
    print("| load | req/s | p50 ms | p99 ms | queue ms per request | errors | load avg |")
    print("|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="queue-signal-") as scratch:
        repository = render_repository(Path(scratch) / "repo", "cpu", args.repository.resolve())
        with EmbeddedTriton(
            repository, Path(scratch) / "work", models=["text_regression_v1"]
        ) as server:
            asyncio.run(measure(server, rates, clients, args.seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
