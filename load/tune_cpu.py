"""``python -m load.tune_cpu``: the CPU-profile tuning experiments behind the profile's defaults.

Each variant renders the CPU profile with its own encoder thread/instance counts, bert batcher
delay and OpenMP wait policy, starts an embedded Triton, and drives ``text_regression_v1`` over
gRPC with the realistic text mix at one concurrency (closed loop). One variant at a time, so none
competes with another. The table it prints is the "what each change bought" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from build_models.pipeline import DEFAULT_REPOSITORY
from build_models.profiles import render_repository
from devtools.triton import EmbeddedTriton
from load.runner import run_closed_loop
from load.targets import TritonGrpcTarget
from load.workload import make_requests


@dataclass(frozen=True)
class Variant:
    """One configuration of the CPU profile."""

    name: str
    torch_threads: int
    encoder_instances: int
    bert_delay_us: int
    omp_wait_policy: str  # "ACTIVE" is libgomp's spinning default; "PASSIVE" sleeps when idle


VARIANTS = [
    Variant("libgomp default waits, 2 threads x 1 encoder", 2, 1, 2000, "ACTIVE"),
    Variant("passive OpenMP waits, 2 threads x 1 encoder", 2, 1, 2000, "PASSIVE"),
    Variant("passive, 1 thread x 1 encoder", 1, 1, 2000, "PASSIVE"),
    Variant("libgomp default waits, 1 thread x 2 encoders", 1, 2, 2000, "ACTIVE"),
    Variant("passive, 1 thread x 2 encoders (profile default)", 1, 2, 2000, "PASSIVE"),
    Variant("passive, 1 thread x 2 encoders, bert delay 0", 1, 2, 0, "PASSIVE"),
    Variant("passive, 1 thread x 3 encoders", 1, 3, 2000, "PASSIVE"),
]


async def measure(variant: Variant, repository: Path, concurrency: int, seconds: float) -> str:
    """Render, serve and load one variant; return its markdown table row."""
    with tempfile.TemporaryDirectory(prefix="tune-") as scratch:
        rendered = render_repository(
            Path(scratch) / "repo",
            "cpu",
            repository,
            instances={"bert": variant.encoder_instances},
            torch_threads=variant.torch_threads,
        )
        bert_config = rendered / "bert_v1" / "config.pbtxt"
        bert_config.write_text(
            re.sub(
                r"max_queue_delay_microseconds: \d+",
                f"max_queue_delay_microseconds: {variant.bert_delay_us}",
                bert_config.read_text(),
            )
        )
        os.environ["OMP_WAIT_POLICY"] = variant.omp_wait_policy
        try:
            server = EmbeddedTriton(rendered, Path(scratch) / "work", models=["text_regression_v1"])
            with server:
                target = TritonGrpcTarget(server.grpc_url, timeout_s=30)
                await target.open()
                try:
                    phase = await run_closed_loop(
                        target,
                        make_requests(1000, 1),
                        concurrency=concurrency,
                        duration_s=seconds,
                        warmup_s=3,
                        timeout_s=30,
                    )
                finally:
                    await target.close()
        finally:
            os.environ.pop("OMP_WAIT_POLICY", None)
    latency = phase.latency
    return (
        f"| {variant.name} | {phase.texts_per_s:.1f} | {latency.p50_ms:.0f} | "
        f"{latency.p99_ms:.0f} | {sum(phase.errors.values())} |"
    )


def main(argv: list[str] | None = None) -> int:
    """Run every variant and print the table."""
    parser = argparse.ArgumentParser(prog="python -m load.tune_cpu", description=__doc__)
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    print(
        f"text_regression_v1 over gRPC, {args.concurrency} clients, realistic mix, 1 text/request\n"
    )
    print("| variant | texts/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|")
    for variant in VARIANTS:
        print(
            asyncio.run(
                measure(variant, args.repository.resolve(), args.concurrency, args.seconds)
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
