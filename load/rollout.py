"""``python -m load rollout``: a model rollout under open-loop load, measured.

The tool starts its own stack (embedded Triton serving a copy of ``--repository``'s version 1, a
``python -m gateway serve`` process with ``--keys`` infer keys and one admin key, the traffic
policy in a file), measures capacity with a short closed loop, then offers open-loop Poisson
arrivals at ``--load`` x capacity, each request from the next key in turn, for the whole run:

1. **baseline** (``--baseline`` s): version 1 alone;
2. **rollout**: build version 2 (on one core at ``nice 19``: here the build shares the machine
   with serving, where a real builder has CPUs of its own),
   render it into the served repository, load it (warm-up included), canary at ``--canary``
   percent until ``--canary-requests`` requests were answered during it, promote, unload v1;
3. **shadow**: v1 reloaded as shadow of v2, interleaved rounds with the shadow off and on;
4. **bad canary**: a version whose forest fails every request after its warm-up
   (``devtools.faulty_version``) as canary: how long until the guard rolls it back, and what
   the callers saw.

It reports every non-200 answer (by phase), p50/p99 per phase, the canary's share of requests and
of keys, keys that saw both versions during the canary, shadow p99 off vs on per round, and the
rollback time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from build_models.profiles import render_repository
from devtools.faulty_version import add_faulty_version
from devtools.triton import EmbeddedTriton
from load.compare import DEFAULT_RESULTS
from load.report import config_json, fmt, machine, markdown_table, run_directory, save_run
from load.runner import run_closed_loop
from load.stack import gateway_process
from load.stats import percentile
from load.targets import HttpTarget
from load.workload import TextMix, make_requests

log = logging.getLogger("load")
FAULTY = 99


@dataclass
class RolloutConfig:
    """Everything ``python -m load rollout`` is told."""

    repository: Path
    results_dir: Path = DEFAULT_RESULTS
    load: float = 0.5
    capacity: float | None = None
    capacity_concurrency: int = 8
    capacity_s: float = 10.0
    keys: int = 1000
    baseline_s: float = 30.0
    canary_percent: float = 10.0
    canary_requests: int = 5000
    v2_build_args: tuple[str, ...] = ("--trees", "30")
    shadow_rounds: int = 3
    shadow_round_s: float = 20.0
    # Shares of the requests copied to the shadow, each measured against no shadow.
    shadow_percents: tuple[float, ...] = (100.0, 10.0)
    bad_canary_percent: float = 10.0
    rollback_timeout_s: float = 60.0
    texts_per_request: int = 1
    request_pool: int = 256
    timeout_s: float = 10.0
    max_in_flight: int = 512
    seed: int = 0
    mix: TextMix = field(default_factory=TextMix)


@dataclass
class Answer:
    """One request of the open loop."""

    scheduled: float
    latency: float
    status: int  # 0: no HTTP answer (connection error, timeout, dropped by the tool)
    version: str
    key: int
    # The error code of a non-200 answer (e.g. "overloaded"), or the kind of failure.
    error: str = ""


class OpenLoop:
    """Poisson arrivals at a fixed rate until stopped; each request from the next key in turn."""

    def __init__(
        self, base_url: str, keys: list[str], requests: list[list[str]], config: RolloutConfig
    ) -> None:
        self.base_url = base_url
        self.keys = keys
        self.requests = requests
        self.config = config
        self.answers: list[Answer] = []
        self.stop = asyncio.Event()
        self._answered = asyncio.Condition()

    async def run(self, rate: float) -> None:
        """Send until :attr:`stop` is set; then wait for the requests in flight."""
        arrivals = random.Random(self.config.seed)
        in_flight: set[asyncio.Task[None]] = set()
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s + 5)
        connector = aiohttp.TCPConnector(limit=self.config.max_in_flight)
        async with aiohttp.ClientSession(
            self.base_url, timeout=timeout, connector=connector
        ) as session:
            scheduled = time.perf_counter()
            index = 0
            while not self.stop.is_set():
                scheduled += arrivals.expovariate(rate)
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                key = index % len(self.keys)
                texts = self.requests[index % len(self.requests)]
                index += 1
                if len(in_flight) >= self.config.max_in_flight:
                    self.answers.append(Answer(scheduled, 0.0, 0, "dropped", key))
                    continue
                task = asyncio.create_task(self._send(session, texts, key, scheduled))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            await asyncio.gather(*in_flight)

    async def _send(
        self, session: aiohttp.ClientSession, texts: list[str], key: int, scheduled: float
    ) -> None:
        headers = {"X-API-Key": self.keys[key], "Content-Type": "application/json"}
        try:
            async with session.post(
                "/v1/predict", data=orjson.dumps({"texts": texts}), headers=headers
            ) as answer:
                body = await answer.read()
                status = answer.status
        except (TimeoutError, aiohttp.ClientError):
            self.answers.append(Answer(scheduled, time.perf_counter() - scheduled, 0, "", key))
            return
        payload = orjson.loads(body)
        version = str(payload.get("model_version", "")) if status == 200 else ""
        error = "" if status == 200 else str(payload.get("error", {}).get("code", ""))
        self.answers.append(
            Answer(scheduled, time.perf_counter() - scheduled, status, version, key, error)
        )
        async with self._answered:
            self._answered.notify_all()

    async def wait_for_answers(self, since: float, count: int) -> None:
        """Until ``count`` requests scheduled from ``since`` on got an HTTP answer."""
        async with self._answered:
            await self._answered.wait_for(
                lambda: sum(1 for a in self.answers if a.scheduled >= since and a.status) >= count
            )

    def between(self, start: float, end: float) -> list[Answer]:
        """The requests scheduled in [start, end)."""
        return [a for a in self.answers if start <= a.scheduled < end]


class Admin:
    """The admin API, as the CLI calls it."""

    def __init__(self, base_url: str, key: str) -> None:
        self.base_url = base_url
        self.headers = {"X-API-Key": key}

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One admin call; raises on any status but 200."""
        timeout = aiohttp.ClientTimeout(total=300)
        async with (
            aiohttp.ClientSession(self.base_url, timeout=timeout) as session,
            session.request(method, path, json=body, headers=self.headers) as answer,
        ):
            payload = await answer.json()
            if answer.status != 200:
                raise RuntimeError(f"{method} {path}: {answer.status} {payload}")
            return payload


def builder_confinement() -> list[str]:
    """The build of v2 runs on the serving machine here, where a real builder has CPUs of its
    own: pinned to the last core (torch, sklearn's threads and all) at the lowest priority."""
    cores = sorted(os.sched_getaffinity(0))
    pin = ["taskset", "-c", str(cores[-1])] if len(cores) > 1 and shutil.which("taskset") else []
    return [*pin, "nice", "-n", "19"]


def phase_stats(answers: list[Answer]) -> dict[str, Any]:
    """Requests, failures by status and p50/p99 of the successful ones (ms)."""
    ok = [a.latency * 1000 for a in answers if a.status == 200]
    failures = Counter(
        f"{a.status} {a.error}".strip() if a.status else (a.version or "no_answer")
        for a in answers
        if a.status != 200
    )
    return {
        "requests": len(answers),
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "p50_ms": percentile(ok, 50),
        "p99_ms": percentile(ok, 99),
    }


async def run_rollout(config: RolloutConfig) -> dict[str, Any]:
    """Start the stack, run the four phases, stop it; write JSON and markdown."""
    from gateway.auth import new_key

    stamp, run_dir = run_directory(config.results_dir, "rollout")
    workdir = run_dir / "work"
    source = workdir / "source"
    # Hard links: the tool builds version 2 into its own copy, never into the caller's repository.
    shutil.copytree(config.repository.resolve(), source, copy_function=os.link)
    served = render_repository(workdir / "served", "cpu", source)
    server = EmbeddedTriton(served, workdir / "triton")
    keys = [new_key(("infer",)) for _ in range(config.keys)]
    admin_key, admin_entry = new_key(("admin",))
    await asyncio.to_thread(server.start)
    try:
        gateway = gateway_process(
            server.grpc_url,
            workdir,
            settings={"GATEWAY_POLICY_PATH": str(workdir / "state" / "policy.json")},
            extra_key_entries=[entry for _, entry in keys] + [admin_entry],
        )
        await asyncio.to_thread(gateway.server.start)
        try:
            measured = await _measure(
                config, gateway.base_url, gateway.api_key, [k for k, _ in keys], admin_key,
                source, served,
            )  # fmt: skip
        finally:
            await asyncio.to_thread(gateway.server.stop)
    finally:
        await asyncio.to_thread(server.stop)
    document = {
        "kind": "rollout",
        "started": stamp,
        "machine": machine(),
        "config": config_json(config),
        **measured,
    }
    return save_run(run_dir, document, rollout_markdown(document))


async def _measure(
    config: RolloutConfig,
    base_url: str,
    probe_key: str,
    keys: list[str],
    admin_key: str,
    source: Path,
    served: Path,
) -> dict[str, Any]:
    requests = make_requests(config.request_pool, config.texts_per_request, config.mix)
    capacity = config.capacity
    if capacity is None:
        target = HttpTarget("gateway", base_url, probe_key, config.timeout_s, 64)
        await target.open()
        try:
            phase = await run_closed_loop(
                target,
                requests,
                concurrency=config.capacity_concurrency,
                duration_s=config.capacity_s,
                warmup_s=2.0,
                timeout_s=config.timeout_s,
            )
        finally:
            await target.close()
        capacity = phase.requests_per_s
    rate = config.load * capacity
    log.info("open loop at %.1f requests/s (%.2f x %.1f)", rate, config.load, capacity)
    admin = Admin(base_url, admin_key)
    loop = OpenLoop(base_url, keys, requests, config)
    traffic = asyncio.create_task(loop.run(rate))
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks[name] = time.perf_counter()
        log.info("phase: %s", name)

    try:
        mark("baseline")
        await asyncio.sleep(config.baseline_s)
        mark("build")
        build = await asyncio.to_thread(
            subprocess.run,
            [*builder_confinement(), sys.executable, "-m", "build_models", "--repository",
             str(source), *config.v2_build_args],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        )  # fmt: skip
        if build.returncode != 0:
            raise RuntimeError(f"building version 2 failed: {build.stderr[-2000:]}")
        await asyncio.to_thread(render_repository, served, "cpu", source, additive=True)
        mark("load")
        await admin.call("POST", "/v1/admin/versions/2/load")
        mark("canary")
        await admin.call(
            "POST", "/v1/admin/policy/canary", {"version": 2, "percent": config.canary_percent}
        )
        canary_start = time.perf_counter()
        # Bounded: twice the time the offered rate needs, and a minute.
        try:
            await asyncio.wait_for(
                loop.wait_for_answers(canary_start, config.canary_requests),
                2 * config.canary_requests / rate + 60,
            )
        except (TimeoutError, asyncio.TimeoutError):
            seen = Counter(
                (a.status, a.version) for a in loop.answers if a.scheduled >= canary_start
            )
            raise RuntimeError(f"the canary phase did not get its answers: {seen}") from None
        mark("promote")
        await admin.call("POST", "/v1/admin/policy/promote")
        mark("unload")
        await admin.call("DELETE", "/v1/admin/versions/1")
        mark("after")
        await asyncio.sleep(10)
        mark("shadow")
        await admin.call("POST", "/v1/admin/versions/1/load")
        shadow_rounds = []
        settings: list[float | None] = [None, *config.shadow_percents]
        for round_index in range(config.shadow_rounds):
            # Interleaved, each round in another order: the machine's drift falls on every setting.
            shift = round_index % len(settings)
            result: dict[str, Any] = {}
            for percent in settings[shift:] + settings[:shift]:
                await admin.call(
                    "POST",
                    "/v1/admin/policy/shadow",
                    {"version": None if percent is None else 1, "percent": percent or 100.0},
                )
                start = time.perf_counter()
                await asyncio.sleep(config.shadow_round_s)
                name = "off" if percent is None else f"{percent:g}%"
                result[name] = phase_stats(loop.between(start + 1.0, time.perf_counter()))
            shadow_rounds.append(result)
        await admin.call("POST", "/v1/admin/policy/shadow", {"version": None})
        mark("bad_canary")
        switch = add_faulty_version(served, source, base=2, version=FAULTY, fault="error")
        await admin.call("POST", f"/v1/admin/versions/{FAULTY}/load")
        await admin.call(
            "POST",
            "/v1/admin/policy/canary",
            {"version": FAULTY, "percent": config.bad_canary_percent},
        )
        switch.touch()  # the canary goes bad now
        bad_start = time.perf_counter()
        rollback_s = None
        policy: dict[str, Any] = {}
        while time.perf_counter() - bad_start < config.rollback_timeout_s:
            policy = (await admin.call("GET", "/v1/admin/policy"))["policy"]
            if policy["canary"] is None:
                rollback_s = time.perf_counter() - bad_start
                break
            await asyncio.sleep(0.2)
        mark("after_rollback")
        await asyncio.sleep(5)
        mark("end")
    finally:
        loop.stop.set()
        await traffic
    return _results(config, loop, marks, capacity, rate, shadow_rounds, rollback_s, policy)


def _results(
    config: RolloutConfig,
    loop: OpenLoop,
    marks: dict[str, float],
    capacity: float,
    rate: float,
    shadow_rounds: list[dict[str, Any]],
    rollback_s: float | None,
    policy: dict[str, Any],
) -> dict[str, Any]:
    names = list(marks)
    phases = {
        name: phase_stats(loop.between(marks[name], marks[names[i + 1]]))
        for i, name in enumerate(names[:-1])
    }
    rollout = phase_stats(loop.between(marks["build"], marks["shadow"]))
    # The canary phase's split, from requests sent a second after the canary was set (the policy
    # applies at once in one gateway) to the promotion.
    canary = [a for a in loop.between(marks["canary"] + 1.0, marks["promote"]) if a.status == 200]
    by_key: dict[int, set[str]] = {}
    for answer in canary:
        by_key.setdefault(answer.key, set()).add(answer.version)
    canary_keys = sum(1 for versions in by_key.values() if versions == {"2"})
    baseline_p99 = phases["baseline"]["p99_ms"]
    return {
        "capacity_requests_per_s": capacity,
        "offered_requests_per_s": rate,
        "phases": phases,
        "rollout": {
            **rollout,
            "p99_vs_baseline": rollout["p99_ms"] / baseline_p99 if baseline_p99 else None,
            "seconds": marks["shadow"] - marks["build"],
        },
        "canary_split": {
            "requests": len(canary),
            "to_canary": sum(1 for a in canary if a.version == "2"),
            "share_percent": 100 * sum(1 for a in canary if a.version == "2") / max(1, len(canary)),
            "keys_seen": len(by_key),
            "keys_on_canary_percent": 100 * canary_keys / max(1, len(by_key)),
            "keys_seeing_both": sum(1 for versions in by_key.values() if len(versions) > 1),
        },
        "shadow_rounds": shadow_rounds,
        "bad_canary": {
            "rollback_s": rollback_s,
            "policy_after": policy,
            **phase_stats(loop.between(marks["bad_canary"], marks["end"])),
        },
    }


def rollout_markdown(document: dict[str, Any]) -> str:
    """The run's summary as markdown."""
    phases = document["phases"]
    rows = [
        [name, stats["requests"], stats["failed"], fmt(stats["p50_ms"]), fmt(stats["p99_ms"])]
        for name, stats in phases.items()
    ]
    rollout = document["rollout"]
    split = document["canary_split"]
    shadow_settings = [name for name in document["shadow_rounds"][0] if name != "off"]
    shadow_rows = [
        [
            index + 1,
            fmt(item["off"]["p99_ms"]),
            *(
                f"{fmt(item[name]['p99_ms'])} ({fmt(item[name]['p99_ms'] / item['off']['p99_ms'], 2)} x)"
                for name in shadow_settings
            ),
            sum(phase["failed"] for phase in item.values()),
        ]
        for index, item in enumerate(document["shadow_rounds"])
    ]
    bad = document["bad_canary"]
    return "\n\n".join(
        [
            f"# Rollout under open-loop load ({document['started']})",
            f"Capacity {fmt(document['capacity_requests_per_s'])} requests/s; offered "
            f"{fmt(document['offered_requests_per_s'])} requests/s (Poisson), "
            f"{document['config']['keys']} API keys in turn.",
            markdown_table(["phase", "requests", "failed", "p50 ms", "p99 ms"], rows),
            f"Rollout (build v2 .. unload v1, {fmt(rollout['seconds'])} s): {rollout['requests']} "
            f"requests, **{rollout['failed']} failed** {rollout['failures'] or ''}; p99 "
            f"{fmt(rollout['p99_ms'])} ms = **{fmt(rollout['p99_vs_baseline'], 2)} x** baseline.",
            f"Canary at {document['config']['canary_percent']} %: {split['requests']} requests, "
            f"**{fmt(split['share_percent'], 2)} %** to the canary; keys on the canary "
            f"{fmt(split['keys_on_canary_percent'], 2)} % of {split['keys_seen']}; keys that saw "
            f"both versions: **{split['keys_seeing_both']}**.",
            "Shadow (v1 shadowing v2), interleaved rounds, p99 ms (x off):\n\n"
            + markdown_table(
                ["round", "off", *(f"shadow {name}" for name in shadow_settings), "failed"],
                shadow_rows,
            ),
            f"Bad canary (v{FAULTY}, every request fails after its warm-up, at "
            f"{document['config']['bad_canary_percent']} %): rolled back after "
            f"**{fmt(bad['rollback_s'])} s** ({bad['policy_after'].get('reason', '')}); callers "
            f"saw {bad['failed']} failures in {bad['requests']} requests {bad['failures'] or ''}.",
        ]
    )
