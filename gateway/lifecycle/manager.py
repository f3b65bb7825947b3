"""The pipeline versions of this gateway: which exist, which are loaded and warm here, the
traffic policy that routes between them, and every change to either (load, unload, canary,
promote, roll back), made without stopping the service.

Loading a version loads its two ensembles in Triton (which loads their composing models) and warms
both up through the whole pipeline before any traffic may reach it. Unloading waits until this
gateway's requests on the version have finished, then unloads the ensembles and the composing
models no other loaded version uses (Triton itself finishes requests already inside a model before
it unloads it). A policy change is a compare-and-swap in the shared store; every replica applies
the stored policy at its next readiness poll, warming up any version it routes and has not warmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway import errors
from gateway.lifecycle.guard import CanaryGuard, GuardLimits
from gateway.lifecycle.naming import parse_versioned, versioned_name
from gateway.lifecycle.policy import Role, TrafficPolicy
from gateway.lifecycle.store import PolicyStore, StoredPolicy
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.triton.api import ModelInfo, RepositoryEntry, TritonApi

log = logging.getLogger(__name__)
GUARD = "canary-guard"
# Warm-up: (model infos of one version) -> runs a real request through each of its ensembles.
WarmUp = Callable[[dict[str, ModelInfo]], Awaitable[None]]


@dataclass
class LoadedVersion:
    """A pipeline version as this gateway holds it."""

    version: int
    state: str = "loading"  # loading -> ready -> unloading; or failed
    reason: str = ""
    models: dict[str, ModelInfo] = field(default_factory=dict)
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


@dataclass(frozen=True)
class VersionStatus:
    """What the admin API shows of one version."""

    version: int
    state: str
    roles: list[str]
    in_flight: int
    reason: str
    manifest: dict[str, Any] | None


class VersionManager:
    """Owns the versions and the policy (see the module's docstring)."""

    def __init__(
        self,
        client: TritonApi,
        settings: Settings,
        metrics: GatewayMetrics,
        store: PolicyStore,
        warm_up: WarmUp,
        callers: Iterable[str] = (),
    ) -> None:
        """``callers``: the digests of every key that may infer, so that a canary share is exact
        over them (any other caller falls in by its own hash bucket)."""
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.store = store
        self.warm_up = warm_up
        self.models = (settings.regression_model, settings.embedding_model)
        self.guard = CanaryGuard(
            GuardLimits(
                window_s=settings.canary_window_s,
                min_requests=settings.canary_min_requests,
                min_latency_requests=settings.canary_min_latency_requests,
                max_error_rate_increase=settings.canary_max_error_rate_increase,
                max_p99_ratio=settings.canary_max_p99_ratio,
                p99_slack_s=settings.canary_p99_slack_s,
            )
        )
        self.callers = frozenset(callers)
        self._canary_callers: frozenset[str] = frozenset()
        self.policy: TrafficPolicy | None = None
        self.history: tuple[TrafficPolicy, ...] = ()
        self._versions: dict[int, LoadedVersion] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    # --- readiness --------------------------------------------------------------------------

    def routed_models(self) -> list[str]:
        """The Triton models that must be ready for the gateway to be: stable's ensembles."""
        if self.policy is None:
            return []
        return [versioned_name(model, self.policy.stable) for model in self.models]

    async def prepare(self) -> None:
        """After every (re)connection: forget what Triton may have lost, adopt the stored policy
        (or make the first one), and load and warm every version it routes."""
        was_ready = sorted(v for v, loaded in self._versions.items() if loaded.state == "ready")
        for version in was_ready:
            self._versions[version].state = "loading"
        self._adopt(self.store.load())
        if self.policy is None:
            await self._first_policy()
        await self._ensure_routed()
        # Versions held ready for a rollback come back too (best effort: traffic needs none).
        for version in was_ready:
            if not self.is_ready(version):
                try:
                    await self.load(version)
                except (errors.GatewayError, TimeoutError, asyncio.TimeoutError) as exc:
                    log.warning(
                        "version not reloaded after reconnection",
                        extra={"version": version, "error": str(exc)},
                    )

    async def refresh(self) -> None:
        """Each readiness poll: apply a policy another replica stored; check the canary."""
        stored = await asyncio.to_thread(self.store.load)
        if stored.policy is not None and (
            self.policy is None or stored.policy.revision != self.policy.revision
        ):
            self._adopt(stored)
            await self._ensure_routed()
        await self.check_canary()

    def _adopt(self, stored: StoredPolicy) -> None:
        previous = self.policy
        self.policy, self.history = stored.policy, stored.history
        if self.policy is not None and (
            previous is None
            or (previous.canary, previous.canary_percent)
            != (self.policy.canary, self.policy.canary_percent)
        ):
            self._canary_callers = self.policy.canary_callers(self.callers)
        canary_before = previous.canary if previous is not None else None
        if canary_before is not None and (
            self.policy is None or self.policy.canary != canary_before
        ):
            self.guard.forget(canary_before)
        self._publish()

    async def _first_policy(self) -> None:
        entries = await self._repository()
        ready = sorted(v for v, state in self._states(entries).items() if state == "READY")
        available = sorted(self._states(entries))
        if not available:
            raise errors.NotReady(
                f"no pipeline version of {self.models[0]} in Triton's repository (build one: "
                "python -m build_models)",
                self.settings.retry_after_s,
            )
        stable = (ready or available)[-1]
        policy = TrafficPolicy(
            revision=1,
            stable=stable,
            updated_at=time.time(),
            updated_by="gateway",
            reason=f"first start: v{stable}, the newest {'loaded' if ready else 'built'} version",
        )
        # Another replica may have stored the first policy meanwhile: then adopt that one.
        with contextlib.suppress(errors.Conflict):
            await asyncio.to_thread(self.store.swap, None, policy)
        self._adopt(self.store.load())

    async def _ensure_routed(self) -> None:
        """Load and warm every version the policy routes; stable must succeed, a canary or shadow
        that fails is logged and left out (its share goes to stable)."""
        assert self.policy is not None
        for version in sorted(self.policy.routed_versions()):
            try:
                await self.load(version)
            except (errors.GatewayError, TimeoutError, asyncio.TimeoutError) as exc:
                if version == self.policy.stable:
                    raise
                log.warning(
                    "routed version failed to load; its traffic goes to stable",
                    extra={"version": version, "error": str(exc)},
                )

    # --- routing ----------------------------------------------------------------------------

    def route(self, caller: str, pinned: int | None) -> tuple[int, Role]:
        """The version that serves this request, and why: pinned by the caller, or the policy's
        choice for the caller (a canary not warm here falls back to stable)."""
        if pinned is not None:
            loaded = self._versions.get(pinned)
            if loaded is None or loaded.state != "ready":
                raise errors.ModelNotFound(
                    f"pipeline version {pinned} is not loaded; loaded: {self._ready_list()}"
                )
            return pinned, "pinned"
        if self.policy is None:
            raise errors.NotReady("no traffic policy yet", self.settings.retry_after_s)
        version: int
        role: Role
        if caller in self.callers and self.policy.canary is not None:
            if caller in self._canary_callers:
                version, role = self.policy.canary, "canary"
            else:
                version, role = self.policy.stable, "stable"
        else:
            version, role = self.policy.route(caller)
        if role == "canary" and not self.is_ready(version):
            return self.policy.stable, "stable"
        return version, role

    def shadow(self) -> int | None:
        """The version that gets a copy of this routed request (a ``shadow_percent`` sample), when
        it is warm here."""
        if self.policy is None:
            return None
        version = self.policy.shadow_copy(random.random())
        return version if version is not None and self.is_ready(version) else None

    def is_ready(self, version: int) -> bool:
        """Whether ``version`` is loaded and warm here."""
        loaded = self._versions.get(version)
        return loaded is not None and loaded.state == "ready"

    def model(self, version: int, model: str) -> ModelInfo:
        """The warm ``model`` of ``version`` (NotReady while it is not)."""
        loaded = self._versions.get(version)
        if loaded is None or loaded.state != "ready":
            raise errors.NotReady(
                f"pipeline version {version} is not ready", self.settings.retry_after_s
            )
        return loaded.models[model]

    @contextlib.contextmanager
    def serving(self, version: int) -> Iterator[None]:
        """Count a request in flight on ``version`` (an unload waits for them)."""
        loaded = self._versions[version]
        loaded.in_flight += 1
        loaded.idle.clear()
        try:
            yield
        finally:
            loaded.in_flight -= 1
            if loaded.in_flight == 0:
                loaded.idle.set()

    def record(self, version: int, role: Role, model: str, ok: bool, latency_s: float) -> None:
        """One request's outcome on ``version``: per-version metrics, and the canary guard."""
        labels = (model, str(version), role)
        self.metrics.version_requests.labels(*labels, "ok" if ok else "error").inc()
        if ok:
            self.metrics.version_latency.labels(*labels).observe(latency_s)
        if role in ("stable", "canary"):
            self.guard.record(version, ok, latency_s, time.monotonic())

    async def check_canary(self) -> TrafficPolicy | None:
        """Roll the canary back when the guard says so; the new policy, or None."""
        policy = self.policy
        if policy is None or policy.canary is None:
            return None
        verdict = self.guard.verdict(policy.stable, policy.canary, time.monotonic())
        if verdict is None:
            return None
        reason = f"automatic rollback: {verdict.reason}"
        try:
            rolled = await self._change(policy.rolled_back(GUARD, reason))
        except errors.Conflict:
            return None  # another replica changed the policy first; the next poll adopts it
        self.metrics.rollbacks.labels(verdict.kind).inc()
        log.warning("canary rolled back", extra={"version": policy.canary, "reason": reason})
        return rolled

    # --- admin ------------------------------------------------------------------------------

    async def statuses(self) -> list[VersionStatus]:
        """Every version in Triton's repository (and any held here), with state and roles."""
        states = self._states(await self._repository())
        result = []
        for version in sorted(set(states) | set(self._versions)):
            loaded = self._versions.get(version)
            result.append(self._status(version, loaded, states.get(version, "UNKNOWN")))
        return result

    async def status(self, version: int) -> VersionStatus:
        """One version's status (ModelNotFound when Triton's repository has no such version)."""
        for status in await self.statuses():
            if status.version == version:
                return status
        raise errors.ModelNotFound(f"no pipeline version {version} in Triton's repository")

    async def load(self, version: int) -> VersionStatus:
        """Load ``version`` in Triton and warm it up here (nothing to do when it is warm)."""
        async with self._lock(version):
            loaded = self._versions.get(version)
            if loaded is not None and loaded.state == "ready":
                return self._status(version, loaded, "READY")
            if loaded is not None and loaded.state == "unloading":
                raise errors.Conflict(f"pipeline version {version} is being unloaded")
            states = self._states(await self._repository())
            if version not in states:
                raise errors.ModelNotFound(f"no pipeline version {version} in Triton's repository")
            loaded = self._versions.setdefault(version, LoadedVersion(version))
            loaded.state, loaded.reason = "loading", ""
            timeout_s = self.settings.warmup_timeout_s
            try:
                for model in self.models:
                    name = versioned_name(model, version)
                    if states[version] != "READY" or not await self._model_ready(name):
                        await self.client.load_model(name, timeout_s)
                infos = {
                    model: await self.client.model_info(versioned_name(model, version), timeout_s)
                    for model in self.models
                }
                await asyncio.wait_for(self.warm_up(infos), timeout_s)
            except (errors.GatewayError, TimeoutError, asyncio.TimeoutError) as exc:
                loaded.state, loaded.reason = "failed", str(exc) or type(exc).__name__
                raise
            loaded.models, loaded.state = infos, "ready"
            log.info("pipeline version ready", extra={"version": version})
            self._publish()
            return self._status(version, loaded, "READY")

    async def unload(self, version: int) -> VersionStatus:
        """Unload ``version`` once its requests here have finished (409 while the policy routes it)."""
        async with self._lock(version):
            if self.policy is not None and version in self.policy.routed_versions():
                raise errors.Conflict(
                    f"pipeline version {version} serves traffic in the policy; roll back or "
                    "promote another version first"
                )
            states = self._states(await self._repository())
            if version not in states:
                raise errors.ModelNotFound(f"no pipeline version {version} in Triton's repository")
            loaded = self._versions.setdefault(version, LoadedVersion(version, state="unloading"))
            loaded.state = "unloading"
            try:
                await asyncio.wait_for(loaded.idle.wait(), self.settings.unload_drain_timeout_s)
            except (TimeoutError, asyncio.TimeoutError):
                loaded.state = "ready" if loaded.models else "failed"
                raise errors.Conflict(
                    f"pipeline version {version} still has {loaded.in_flight} requests in flight "
                    f"after {self.settings.unload_drain_timeout_s:g} s; not unloaded"
                ) from None
            await self._unload_from_triton(version)
            del self._versions[version]
            self.guard.forget(version)
            self._publish()
            log.info("pipeline version unloaded", extra={"version": version})
            return await self.status(version)

    async def change_policy(
        self, change: Callable[[TrafficPolicy], TrafficPolicy]
    ) -> TrafficPolicy:
        """Apply ``change`` to the current stored policy; every version it routes must be warm
        here first (409 otherwise). A compare-and-swap: 409 when another replica won the race."""
        stored = await asyncio.to_thread(self.store.load)
        self._adopt(stored)
        if self.policy is None:
            raise errors.NotReady("no traffic policy yet", self.settings.retry_after_s)
        policy = change(self.policy)
        cold = sorted(v for v in policy.routed_versions() if not self.is_ready(v))
        if cold:
            raise errors.Conflict(
                f"pipeline version(s) {', '.join(map(str, cold))} not loaded and warm here; "
                "load them first"
            )
        return await self._change(policy)

    async def _change(self, policy: TrafficPolicy) -> TrafficPolicy:
        assert self.policy is not None
        self._adopt(await asyncio.to_thread(self.store.swap, self.policy.revision, policy))
        log.info(
            "traffic policy changed",
            extra={"revision": policy.revision, "by": policy.updated_by, "reason": policy.reason},
        )
        return policy

    # --- helpers ----------------------------------------------------------------------------

    def _lock(self, version: int) -> asyncio.Lock:
        return self._locks.setdefault(version, asyncio.Lock())

    async def _repository(self) -> list[RepositoryEntry]:
        return await self.client.repository_index(self.settings.request_timeout_s)

    def _states(self, entries: list[RepositoryEntry]) -> dict[int, str]:
        """Pipeline version -> Triton's state of its regression ensemble."""
        states: dict[int, str] = {}
        for entry in entries:
            parsed = parse_versioned(entry.name)
            if parsed is not None and parsed[0] == self.models[0]:
                states[parsed[1]] = entry.state or "UNAVAILABLE"
        return states

    async def _model_ready(self, name: str) -> bool:
        ready, _ = await self.client.is_ready([name], self.settings.request_timeout_s)
        return ready

    async def _unload_from_triton(self, version: int) -> None:
        """The version's ensembles, then their composing models that no other loaded ensemble uses."""
        timeout_s = self.settings.warmup_timeout_s
        mine: set[str] = set()
        for model in self.models:
            name = versioned_name(model, version)
            with contextlib.suppress(errors.GatewayError):
                mine.update((await self.client.model_info(name, timeout_s)).composing_models)
            await self.client.unload_model(name, timeout_s)
        still_used: set[str] = set()
        for entry in await self._repository():
            parsed = parse_versioned(entry.name)
            if parsed is None or parsed[0] not in self.models or entry.state != "READY":
                continue
            with contextlib.suppress(errors.GatewayError):
                info = await self.client.model_info(entry.name, timeout_s)
                still_used.update(info.composing_models)
        for name in sorted(mine - still_used):
            await self.client.unload_model(name, timeout_s)

    def _status(
        self, version: int, loaded: LoadedVersion | None, triton_state: str
    ) -> VersionStatus:
        roles = []
        if self.policy is not None:
            for role in ("stable", "canary", "shadow"):
                if getattr(self.policy, role) == version:
                    roles.append(role)
        if loaded is not None:
            state, reason, in_flight = loaded.state, loaded.reason, loaded.in_flight
        else:
            state = "loaded_elsewhere" if triton_state == "READY" else "available"
            reason, in_flight = "", 0
        return VersionStatus(version, state, roles, in_flight, reason, self._manifest(loaded))

    @staticmethod
    def _manifest(loaded: LoadedVersion | None) -> dict[str, Any] | None:
        if loaded is None or not loaded.models:
            return None
        for info in loaded.models.values():
            raw = info.parameters.get("pipeline_manifest")
            if raw:
                manifest: dict[str, Any] = json.loads(raw)
                return manifest
        return None

    def _ready_list(self) -> str:
        ready = sorted(v for v, loaded in self._versions.items() if loaded.state == "ready")
        return ", ".join(map(str, ready)) or "none"

    def _publish(self) -> None:
        policy = self.policy
        if policy is None:
            return
        self.metrics.policy_revision.set(policy.revision)
        self.metrics.traffic_share.clear()
        canary_share = policy.canary_percent if policy.canary is not None else 0.0
        self.metrics.traffic_share.labels(str(policy.stable), "stable").set(100 - canary_share)
        if policy.canary is not None:
            self.metrics.traffic_share.labels(str(policy.canary), "canary").set(canary_share)
        if policy.shadow is not None:
            self.metrics.traffic_share.labels(str(policy.shadow), "shadow").set(
                policy.shadow_percent
            )
