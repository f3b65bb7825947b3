"""``python -m load chaos``: SIGKILL Triton under steady load and check that nothing hangs or leaks.

The tool starts an embedded Triton under the dev supervisor (``devtools.supervisor``, as
``python -m gateway dev`` runs it) and a ``python -m gateway serve`` process in front of it
(``GATEWAY_REQUEST_TIMEOUT_S`` = ``--deadline``, ``GATEWAY_TRANSPORT`` = ``--transport``, its own
``GATEWAY_SHM_PREFIX``), drives open-loop Poisson load at ``--rate``, and ``--kills`` times: waits
``--steady`` seconds, SIGKILLs the tritonserver process alone (its stubs stay behind, as after a
real crash), and polls ``/readyz`` until it drops and until it is back.

It reports hung requests (no answer within deadline + margin), failed requests by status, per kill
the time for readiness to drop and to return (and Triton's own start-to-ready, the warm-up the
return is judged against), stubs of dead servers still alive once the gateway was ready again,
and, after everything stopped, processes and /dev/shm entries left behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from devtools.process import process_group_members, processes_running
from devtools.supervisor import TritonSupervisor
from devtools.triton import SHM_DIR, EmbeddedTriton
from load.compare import DEFAULT_RESULTS
from load.report import config_json, fmt, machine, markdown_table, met, run_directory, save_run
from load.runner import run_open_loop
from load.stack import GatewayProcess, embedded_triton, gateway_process
from load.stats import PhaseResult
from load.targets import HttpTarget
from load.workload import TextMix, make_requests

log = logging.getLogger("load")

PER_KILL_HEADER = (
    "kill",
    "readiness false s",
    "ready again s",
    "Triton start-to-ready s",
    "backoff s",
    "over warm-up s",
    "orphans",
    "restart error",
)
# The targets.
DROP_TARGET_S = 2.0
BACK_OVER_WARMUP_TARGET_S = 5.0


@dataclass
class ChaosConfig:
    """Everything ``python -m load chaos`` is told."""

    repository: Path
    results_dir: Path = DEFAULT_RESULTS
    kills: int = 20
    rate: float = 10.0
    # Load while ready before each kill. Above the supervisor's stable period (10 s), so that
    # every kill meets the first backoff delay: the run measures recovery, not the backoff.
    steady_s: float = 12.0
    deadline_s: float = 10.0
    margin_s: float = 2.0
    transport: str = "system_shm"
    recovery_timeout_s: float = 120.0
    poll_s: float = 0.02
    max_in_flight: int = 256
    texts_per_request: int = 1
    request_pool: int = 2000
    mix: TextMix = field(default_factory=TextMix)
    seed: int = 0


@dataclass
class Kill:
    """One SIGKILL and what followed (seconds from the kill)."""

    number: int
    pid: int
    readiness_dropped_s: float | None = None
    ready_again_s: float | None = None
    backoff_s: float | None = None
    # Launch to ready of the restarted Triton: the warm-up the return is judged against.
    triton_start_to_ready_s: float | None = None
    # Processes of the killed server's group still alive once the gateway was ready again.
    orphans: int = 0
    restart_error: str | None = None

    @property
    def over_warmup_s(self) -> float | None:
        """Ready again after the kill, less Triton's own start-to-ready."""
        if self.ready_again_s is None or self.triton_start_to_ready_s is None:
            return None
        return self.ready_again_s - self.triton_start_to_ready_s

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "over_warmup_s": self.over_warmup_s}


async def run_chaos(config: ChaosConfig) -> dict[str, Any]:
    """Start the stack, drive load through ``config.kills`` kills, stop it, look for leftovers;
    write JSON and markdown under ``results_dir``."""
    stamp, run_dir = run_directory(config.results_dir, "chaos")
    workdir = run_dir / "work"
    gateway_prefix = f"load-chaos-{secrets.token_hex(4)}"
    server = embedded_triton(config.repository, workdir)
    log.info("triton: starting the embedded server")
    await asyncio.to_thread(server.start)
    supervisor = TritonSupervisor(server).start()
    try:
        gateway = gateway_process(
            server.grpc_url,
            workdir,
            settings={
                "GATEWAY_REQUEST_TIMEOUT_S": str(config.deadline_s),
                "GATEWAY_TRANSPORT": config.transport,
                "GATEWAY_SHM_PREFIX": gateway_prefix,
            },
            max_texts_per_request=config.texts_per_request,
        )
        log.info("gateway: starting on %s", gateway.base_url)
        await asyncio.to_thread(gateway.server.start)
        try:
            phase, kills = await _drive(config, gateway, server, supervisor)
        finally:
            await asyncio.to_thread(gateway.server.stop)
    finally:
        # The supervisor first: it would restart a Triton stopped under it.
        await asyncio.to_thread(supervisor.stop)
        await asyncio.to_thread(server.stop)
    leaked = sorted(
        path.name
        for prefix in (server.shm_prefix, gateway_prefix)
        for path in SHM_DIR.glob(prefix + "*")
    )
    document: dict[str, Any] = {
        "kind": "chaos",
        "started": stamp,
        "machine": machine(),
        "config": config_json(config),
        "load": phase.to_json(include_latencies=False),
        "hung_requests": phase.errors.get("timeout", 0),
        "kills": [kill.to_json() for kill in kills],
        "orphans_after_restarts": sum(kill.orphans for kill in kills),
        "orphan_processes_at_end": processes_running(server.workdir),
        "leaked_shm_at_end": leaked,
    }
    return save_run(run_dir, document, chaos_markdown(document))


async def _drive(
    config: ChaosConfig,
    gateway: GatewayProcess,
    server: EmbeddedTriton,
    supervisor: TritonSupervisor,
) -> tuple[PhaseResult, list[Kill]]:
    """Steady load through every kill; returns the load's phase and the kills."""
    answer_within_s = config.deadline_s + config.margin_s
    target = HttpTarget(
        "gateway",
        gateway.base_url,
        gateway.api_key,
        timeout_s=answer_within_s,
        max_connections=config.max_in_flight,
    )
    requests = make_requests(config.request_pool, config.texts_per_request, config.mix)
    stop = asyncio.Event()
    await target.open()
    kills: list[Kill] = []
    # The load's own bound, in case every kill takes as long as it may.
    bound_s = config.kills * (config.steady_s + config.recovery_timeout_s) + 2 * config.steady_s
    load = asyncio.create_task(
        run_open_loop(
            target,
            requests,
            rate_per_s=config.rate,
            duration_s=bound_s,
            max_in_flight=config.max_in_flight,
            timeout_s=answer_within_s,
            seed=config.seed,
            stop=stop,
        )
    )
    try:
        async with aiohttp.ClientSession(gateway.base_url) as session:
            for number in range(1, config.kills + 1):
                await asyncio.sleep(config.steady_s)
                kill = await _kill_once(number, config, server, supervisor, session)
                kills.append(kill)
                log.info(
                    "kill %d: readiness false after %s s, back after %s s (Triton %s s)",
                    number,
                    fmt(kill.readiness_dropped_s, 2),
                    fmt(kill.ready_again_s, 2),
                    fmt(kill.triton_start_to_ready_s, 2),
                )
                if kill.ready_again_s is None:
                    log.error("kill %d: readiness did not return; no more kills", number)
                    break
            await asyncio.sleep(config.steady_s)
    finally:
        stop.set()
        phase = await load
        await target.close()
    return phase, kills


async def _kill_once(
    number: int,
    config: ChaosConfig,
    server: EmbeddedTriton,
    supervisor: TritonSupervisor,
    session: aiohttp.ClientSession,
) -> Kill:
    process = server.process
    assert process is not None and process.poll() is None, "Triton is not running"
    seen = len(supervisor.restarts)
    kill = Kill(number, process.pid)
    killed_at = time.perf_counter()
    # The server alone, as a crash would: its Python-backend stubs survive it.
    os.kill(process.pid, signal.SIGKILL)
    dropped = await _readiness_becomes(
        session, False, killed_at + config.recovery_timeout_s, config
    )
    if dropped is not None:
        kill.readiness_dropped_s = dropped - killed_at
        back = await _readiness_becomes(
            session, True, killed_at + config.recovery_timeout_s, config
        )
        if back is not None:
            kill.ready_again_s = back - killed_at
    # The supervisor records the restart from its own thread: give it a moment to finish.
    deadline = time.perf_counter() + 5.0
    while time.perf_counter() < deadline:
        restarts = supervisor.restarts[seen:]
        if restarts and (restarts[-1].ready_at is not None or restarts[-1].error):
            break
        await asyncio.sleep(0.05)
    restarts = supervisor.restarts[seen:]
    if restarts:
        kill.backoff_s = sum(restart.delay_s for restart in restarts)
        kill.triton_start_to_ready_s = restarts[-1].start_to_ready_s
        kill.restart_error = next((r.error for r in restarts if r.error), None)
    kill.orphans = len(process_group_members(process.pid))
    return kill


async def _readiness_becomes(
    session: aiohttp.ClientSession, ready: bool, deadline: float, config: ChaosConfig
) -> float | None:
    """When ``/readyz`` first answered ``ready`` (perf_counter), polling every ``poll_s``; None if
    not before ``deadline``."""
    while time.perf_counter() < deadline:
        try:
            async with session.get("/readyz", timeout=aiohttp.ClientTimeout(total=1.0)) as answer:
                now_ready = answer.status == 200
        except (aiohttp.ClientError, TimeoutError):
            now_ready = False
        if now_ready == ready:
            return time.perf_counter()
        await asyncio.sleep(config.poll_s)
    return None


def chaos_markdown(document: dict[str, Any]) -> str:
    """The verdict against the issue's targets, then one row per kill."""
    config, load, kills = document["config"], document["load"], document["kills"]
    drops = [kill["readiness_dropped_s"] for kill in kills]
    overs = [kill["over_warmup_s"] for kill in kills]
    backs = [kill["ready_again_s"] for kill in kills]
    warmups = [kill["triton_start_to_ready_s"] for kill in kills]
    complete = bool(kills) and len(kills) == config["kills"]

    def worst(values: list[float | None]) -> float | None:
        return None if not values or None in values else max(v for v in values if v is not None)

    def within(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit and complete

    hung = document["hung_requests"]
    orphans_end = len(document["orphan_processes_at_end"])
    leaked = len(document["leaked_shm_at_end"])
    errors = ", ".join(f"{kind}: {n}" for kind, n in load["errors"].items()) or "none"
    answer_within = config["deadline_s"] + config["margin_s"]
    summary = [
        (f"hung requests (no answer within {answer_within:g} s = deadline + margin)", hung,
         "0", met(hung == 0)),
        ("readiness false after a kill, worst", f"{fmt(worst(drops), 2)} s",
         f"<= {DROP_TARGET_S:g} s", met(within(worst(drops), DROP_TARGET_S))),
        ("ready again after a kill, worst (Triton start-to-ready: worst)",
         f"{fmt(worst(backs), 2)} s ({fmt(worst(warmups), 2)} s)", "-", "-"),
        ("ready again minus Triton start-to-ready (warm-up), worst", f"{fmt(worst(overs), 2)} s",
         f"<= {BACK_OVER_WARMUP_TARGET_S:g} s",
         met(within(worst(overs), BACK_OVER_WARMUP_TARGET_S))),
        ("stubs of dead servers alive once ready again (all kills)",
         document["orphans_after_restarts"], "0", met(document["orphans_after_restarts"] == 0)),
        ("processes left at the end", orphans_end, "0", met(orphans_end == 0)),
        ("/dev/shm entries left at the end", leaked, "0", met(leaked == 0)),
    ]  # fmt: skip
    per_kill = [
        (kill["number"], fmt(kill["readiness_dropped_s"], 2), fmt(kill["ready_again_s"], 2),
         fmt(kill["triton_start_to_ready_s"], 2), fmt(kill["backoff_s"], 2),
         fmt(kill["over_warmup_s"], 2), kill["orphans"], kill["restart_error"] or "")
        for kill in kills
    ]  # fmt: skip
    return (
        "\n\n".join(
            [
                f"### Chaos: {len(kills)} of {config['kills']} SIGKILLs of tritonserver under the "
                f"dev supervisor, {config['rate']:g} req/s Poisson, transport {config['transport']}",
                markdown_table(("measure", "measured", "target", "met"), summary),
                f"Requests: {load['requests']} sent, {load['ok_requests']} answered 200; "
                f"failed by kind: {errors}.",
                markdown_table(PER_KILL_HEADER, per_kill),
            ]
        )
        + "\n"
    )
