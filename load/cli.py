"""``python -m load``: compare every target in one run, drive one target, or benchmark in-process.

Subcommands:
  compare   raw in-process + naive baseline + Triton + the gateway in front of that Triton,
            one after the other on this machine; prints the ratio table, writes JSON + PNG.
  run       one target (gateway, triton or baseline), closed and/or open loop.
  raw       the in-process pipeline at several batch sizes (the machine's limit).
  baseline  serve the naive baseline in the foreground (e.g. for Locust).
  overload  the gateway offered k x its capacity: goodput, refusals, memory, recovery.
  rollout   a model rollout, shadow traffic and a bad canary under open-loop load.
  chaos     SIGKILL Triton N times under steady load: hung requests, readiness, leftovers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from load.compare import DEFAULT_RESULTS, CompareConfig, PhasePlan, run_compare
from load.engine import DEFAULT_TORCH_THREADS
from load.raw import DEFAULT_BATCH_SIZES
from load.workload import (
    DEFAULT_MAX_WORDS,
    DEFAULT_MEDIAN_WORDS,
    DEFAULT_SEED,
    DEFAULT_SIGMA,
    TextMix,
)

GATEWAY_KEY_ENV = "LOAD_GATEWAY_API_KEY"


def _ints(text: str) -> list[int]:
    values = [int(item) for item in text.split(",") if item.strip()]
    if not values or any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,16, got {text!r}")
    return values


def _add_workload(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload")
    group.add_argument("--texts-per-request", type=int, default=1)
    group.add_argument(
        "--median-words",
        type=float,
        default=DEFAULT_MEDIAN_WORDS,
        help="median words per text (lognormal)",
    )
    group.add_argument(
        "--sigma", type=float, default=DEFAULT_SIGMA, help="lognormal sigma of word counts"
    )
    group.add_argument(
        "--max-words", type=int, default=DEFAULT_MAX_WORDS, help="cap on words per text"
    )
    group.add_argument("--seed", type=int, default=DEFAULT_SEED)
    group.add_argument("--request-pool", type=int, default=2000, help="distinct requests, cycled")


def _add_plan(parser: argparse.ArgumentParser, default_concurrency: str) -> None:
    group = parser.add_argument_group("phases")
    group.add_argument(
        "--concurrency",
        type=_ints,
        default=_ints(default_concurrency),
        help="closed-loop client counts, e.g. 1,16 (empty with --no-closed)",
    )
    group.add_argument("--no-closed", action="store_true", help="skip the closed-loop phases")
    group.add_argument("--duration", type=float, default=30.0, help="measured seconds per phase")
    group.add_argument(
        "--warmup", type=float, default=5.0, help="unmeasured seconds before each phase"
    )
    group.add_argument(
        "--max-requests", type=int, default=None, help="stop a phase after this many"
    )
    group.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open-loop requests/s (default: 0.7 x the first target's top closed-loop rate)",
    )
    group.add_argument("--no-open", action="store_true", help="skip the open-loop phase")
    group.add_argument("--max-in-flight", type=int, default=64, help="open loop: beyond this, drop")
    group.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, s")


def _plan(args: argparse.Namespace) -> PhasePlan:
    return PhasePlan(
        concurrencies=[] if args.no_closed else args.concurrency,
        duration_s=args.duration,
        warmup_s=args.warmup,
        max_requests=args.max_requests,
        open_rate=args.rate,
        run_open_loop=not args.no_open,
        max_in_flight=args.max_in_flight,
        timeout_s=args.timeout,
        seed=args.seed,
    )


def _mix(args: argparse.Namespace) -> TextMix:
    return TextMix(args.median_words, args.sigma, args.max_words, args.seed)


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    """The traffic settings every command's configuration takes (see ``_add_workload``)."""
    return {
        "texts_per_request": args.texts_per_request,
        "request_pool": args.request_pool,
        "mix": _mix(args),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)

    compare = commands.add_parser(
        "compare", help="every target in one run; ratio table + JSON + PNG"
    )
    compare.add_argument(
        "--repository",
        type=Path,
        default=Path("model_repository"),
        help="built model repository (python -m build_models)",
    )
    compare.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    compare.add_argument(
        "--targets",
        default="raw,baseline,triton,gateway",
        help="subset of raw,baseline,triton,gateway",
    )
    compare.add_argument(
        "--triton-url",
        default=None,
        help="host:port of a running Triton gRPC (default: start an embedded one)",
    )
    compare.add_argument(
        "--gateway-url",
        default=None,
        help="a running gateway, e.g. http://127.0.0.1:8000 (omit: one is started here)",
    )
    compare.add_argument(
        "--gateway-key", default=None, help=f"API key (better: env {GATEWAY_KEY_ENV})"
    )
    compare.add_argument("--raw-batch-sizes", type=_ints, default=list(DEFAULT_BATCH_SIZES))
    compare.add_argument("--raw-seconds", type=float, default=10.0, help="per batch size")
    compare.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS)
    _add_workload(compare)
    _add_plan(compare, "1,16")

    run = commands.add_parser("run", help="drive one target")
    run.add_argument("target", choices=["gateway", "triton", "baseline"])
    run.add_argument(
        "--url",
        default=None,
        help="gateway: http://127.0.0.1:PORT; triton: 127.0.0.1:PORT (default: start it here)",
    )
    run.add_argument("--api-key", default=None, help=f"gateway key (better: env {GATEWAY_KEY_ENV})")
    run.add_argument("--repository", type=Path, default=Path("model_repository"))
    run.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    run.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS)
    _add_workload(run)
    _add_plan(run, "16")

    raw = commands.add_parser("raw", help="in-process pipeline at several batch sizes")
    raw.add_argument("--repository", type=Path, default=Path("model_repository"))
    raw.add_argument("--batch-sizes", type=_ints, default=list(DEFAULT_BATCH_SIZES))
    raw.add_argument("--seconds", type=float, default=10.0, help="per batch size")
    raw.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS)
    _add_workload(raw)

    overload = commands.add_parser(
        "overload", help="open loop at k x capacity against a gateway started here"
    )
    overload.add_argument("--repository", type=Path, default=Path("model_repository"))
    overload.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    overload.add_argument("--factor", type=float, default=4.0, help="offered rate / capacity")
    overload.add_argument("--duration", type=float, default=60.0, help="seconds of the burst")
    overload.add_argument(
        "--capacity", type=float, default=None, help="requests/s (default: measure it first)"
    )
    overload.add_argument("--capacity-concurrency", type=int, default=16)
    overload.add_argument("--capacity-seconds", type=float, default=10.0)
    overload.add_argument("--warmup", type=float, default=3.0, help="before the capacity run")
    overload.add_argument("--probes", type=int, default=20, help="single requests before")
    overload.add_argument("--window", type=int, default=5, help="probes judged together after")
    overload.add_argument("--tolerance", type=float, default=1.5, help="x the normal p50")
    overload.add_argument("--recovery-timeout", type=float, default=120.0)
    overload.add_argument("--max-in-flight", type=int, default=1024)
    overload.add_argument(
        "--timeout", type=float, default=30.0, help="client timeout, above the gateway's deadline"
    )
    _add_workload(overload)

    rollout = commands.add_parser(
        "rollout",
        help="a rollout (build v2, load, canary, promote, unload), shadow and a bad canary, "
        "under open-loop load against a stack started here",
    )
    rollout.add_argument("--repository", type=Path, default=Path("model_repository"))
    rollout.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    rollout.add_argument("--load", type=float, default=0.5, help="offered rate / capacity")
    rollout.add_argument(
        "--capacity", type=float, help="requests/s the stack serves (default: measured)"
    )
    rollout.add_argument("--keys", type=int, default=1000, help="infer keys, used in turn")
    rollout.add_argument("--baseline", type=float, default=30.0, help="seconds before the rollout")
    rollout.add_argument("--canary", type=float, default=10.0, help="canary percent")
    rollout.add_argument("--canary-requests", type=int, default=5000)
    rollout.add_argument("--shadow-rounds", type=int, default=3)
    rollout.add_argument("--shadow-seconds", type=float, default=20.0)
    rollout.add_argument("--timeout", type=float, default=10.0)
    rollout.add_argument("--seed", type=int, default=0)

    chaos = commands.add_parser(
        "chaos", help="SIGKILL Triton (under the dev supervisor) N times under steady load"
    )
    chaos.add_argument("--repository", type=Path, default=Path("model_repository"))
    chaos.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    chaos.add_argument("--kills", type=int, default=20)
    chaos.add_argument("--rate", type=float, default=10.0, help="steady requests/s (Poisson)")
    chaos.add_argument("--steady", type=float, default=12.0, help="seconds of load before a kill")
    chaos.add_argument("--deadline", type=float, default=10.0, help="GATEWAY_REQUEST_TIMEOUT_S")
    chaos.add_argument(
        "--margin", type=float, default=2.0, help="no answer by deadline + margin: hung"
    )
    chaos.add_argument("--transport", choices=["grpc", "system_shm", "auto"], default="system_shm")
    chaos.add_argument("--recovery-timeout", type=float, default=120.0, help="per kill")
    _add_workload(chaos)

    serve = commands.add_parser("baseline", help="serve the naive baseline in the foreground")
    serve.add_argument("--repository", type=Path, default=Path("model_repository"))
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS)
    return parser


def _config(args: argparse.Namespace, **specific: Any) -> CompareConfig:
    """The parts of a run's configuration that `compare` and `run` share, plus ``specific``."""
    return CompareConfig(
        repository=args.repository,
        results_dir=args.results,
        plan=_plan(args),
        torch_threads=args.torch_threads,
        **_workload(args),
        **specific,
    )


def _execute(config: CompareConfig) -> int:
    document = asyncio.run(run_compare(config))
    print(document["markdown"])
    print(f"written: {document['run_dir']}/results.json, results.png, summary.md")
    return 0


def _compare(args: argparse.Namespace) -> int:
    targets = [item.strip() for item in args.targets.split(",") if item.strip()]
    unknown = set(targets) - {"raw", "baseline", "triton", "gateway"}
    if unknown:
        raise SystemExit(f"unknown targets: {sorted(unknown)}")
    return _execute(
        _config(
            args,
            raw_batch_sizes=args.raw_batch_sizes,
            raw_seconds=args.raw_seconds,
            targets=targets,
            triton_url=args.triton_url,
            gateway_url=args.gateway_url,
            gateway_key=args.gateway_key or os.environ.get(GATEWAY_KEY_ENV),
        )
    )


def _run(args: argparse.Namespace) -> int:
    # One target is a compare run restricted to it: same phases, same report files. Without
    # --url the tool starts what the target needs (the gateway: an embedded Triton behind it).
    return _execute(
        _config(
            args,
            targets=[args.target],
            triton_url=args.url if args.target == "triton" else None,
            gateway_url=args.url if args.target == "gateway" else None,
            gateway_key=args.api_key or os.environ.get(GATEWAY_KEY_ENV),
        )
    )


def _raw(args: argparse.Namespace) -> int:
    from load.raw import run_raw_benchmark
    from load.report import raw_table
    from load.workload import make_texts

    texts = make_texts(args.request_pool, _mix(args))
    results = run_raw_benchmark(
        args.repository, texts, args.batch_sizes, args.seconds, torch_threads=args.torch_threads
    )
    print(raw_table(results))
    return 0


def _baseline(args: argparse.Namespace) -> int:
    import uvicorn

    os.environ["LOAD_BASELINE_REPOSITORY"] = str(args.repository.resolve())
    os.environ["LOAD_BASELINE_TORCH_THREADS"] = str(args.torch_threads)
    if not os.environ.get("LOAD_BASELINE_API_KEY"):
        print(
            "warning: LOAD_BASELINE_API_KEY is unset; the baseline accepts any key", file=sys.stderr
        )
    uvicorn.run(
        "load.baseline:create_app",
        factory=True,
        host="127.0.0.1",
        port=args.port,
        workers=1,
        access_log=False,
    )
    return 0


def _overload(args: argparse.Namespace) -> int:
    from load.overload import OverloadConfig, run_overload

    config = OverloadConfig(
        repository=args.repository,
        results_dir=args.results,
        factor=args.factor,
        duration_s=args.duration,
        capacity=args.capacity,
        capacity_concurrency=args.capacity_concurrency,
        capacity_s=args.capacity_seconds,
        warmup_s=args.warmup,
        probes=args.probes,
        window=args.window,
        tolerance=args.tolerance,
        recovery_timeout_s=args.recovery_timeout,
        max_in_flight=args.max_in_flight,
        timeout_s=args.timeout,
        seed=args.seed,
        **_workload(args),
    )
    return _report(asyncio.run(run_overload(config)))


def _rollout(args: argparse.Namespace) -> int:
    from load.rollout import RolloutConfig, run_rollout

    config = RolloutConfig(
        repository=args.repository,
        results_dir=args.results,
        load=args.load,
        capacity=args.capacity,
        keys=args.keys,
        baseline_s=args.baseline,
        canary_percent=args.canary,
        canary_requests=args.canary_requests,
        shadow_rounds=args.shadow_rounds,
        shadow_round_s=args.shadow_seconds,
        timeout_s=args.timeout,
        seed=args.seed,
    )
    return _report(asyncio.run(run_rollout(config)))


def _chaos(args: argparse.Namespace) -> int:
    from load.chaos import ChaosConfig, run_chaos

    config = ChaosConfig(
        repository=args.repository,
        results_dir=args.results,
        kills=args.kills,
        rate=args.rate,
        steady_s=args.steady,
        deadline_s=args.deadline,
        margin_s=args.margin,
        transport=args.transport,
        recovery_timeout_s=args.recovery_timeout,
        seed=args.seed,
        **_workload(args),
    )
    return _report(asyncio.run(run_chaos(config)))


def _report(document: dict[str, Any]) -> int:
    print(document["markdown"])
    print(f"written: {document['run_dir']}/results.json, summary.md")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m load``."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
    )
    handlers = {
        "compare": _compare,
        "run": _run,
        "raw": _raw,
        "baseline": _baseline,
        "overload": _overload,
        "chaos": _chaos,
        "rollout": _rollout,
    }
    # SIGTERM (a `timeout`, a CI job cancelled) stops the servers the same way as Ctrl-C: by the
    # finally blocks that stop them, which the default SIGTERM action would skip.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        # Child servers are stopped by their finally blocks / atexit hooks on the way out.
        print("interrupted", file=sys.stderr)
        return 130
