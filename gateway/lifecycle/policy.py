"""The traffic policy: which pipeline version serves (stable), which gets a share of the callers
(canary, sticky per API key), which gets a copy of the traffic (shadow).

A policy is an immutable value with a revision; every change makes a new one (revision + 1), so
replicas that share a store can tell whether theirs is current and a write can be a
compare-and-swap.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from gateway import errors

Role = Literal["stable", "canary", "shadow", "pinned"]
# Canary shares are decided in these steps: 10,000 buckets = 0.01 percentage points.
BUCKETS = 10_000


@dataclass(frozen=True)
class TrafficPolicy:
    """Where traffic goes. ``canary_percent`` of the API keys (a stable subset: each key hashes to
    a bucket) go to ``canary``; the others to ``stable``; ``shadow`` gets a copy of
    ``shadow_percent`` of the routed requests (a sample: a copy costs a whole pipeline run)."""

    revision: int
    stable: int
    canary: int | None = None
    canary_percent: float = 0.0
    shadow: int | None = None
    shadow_percent: float = 100.0
    previous_stable: int | None = None
    updated_at: float = 0.0
    updated_by: str = ""
    reason: str = ""

    def routed_versions(self) -> set[int]:
        """Every version this policy sends traffic (or a copy of it) to."""
        return {v for v in (self.stable, self.canary, self.shadow) if v is not None}

    def route(self, caller: str) -> tuple[int, Role]:
        """The version (and its role) that serves ``caller`` (an API key digest) by the caller's
        hash bucket: sticky, as it depends on the key and the canary version alone. The gateway
        uses it for a caller outside the set :meth:`canary_callers` drew from."""
        if (
            self.canary is not None
            and self.canary_percent > 0
            and _rank(self.canary, caller) % BUCKETS < self.canary_percent * BUCKETS / 100
        ):
            return self.canary, "canary"
        return self.stable, "stable"

    def canary_callers(self, known: Iterable[str]) -> frozenset[str]:
        """Exactly ``canary_percent`` of the ``known`` callers (rounded, at least one), chosen by
        their hash with the canary version: a hash bucket per caller would miss the share by
        about sqrt(p(1-p)/n) (1 point for 1,000 keys). A larger share keeps every caller of a
        smaller one (the same order, a longer prefix)."""
        callers = sorted(set(known), key=lambda caller: _rank(self.canary or 0, caller))
        if self.canary is None or self.canary_percent <= 0 or not callers:
            return frozenset()
        count = max(1, round(self.canary_percent / 100 * len(callers)))
        return frozenset(callers[:count])

    def shadow_copy(self, draw: float) -> int | None:
        """The shadow version if this request (``draw``: uniform in [0, 1)) is in its sample."""
        if self.shadow is None or draw * 100 >= self.shadow_percent:
            return None
        return self.shadow

    def changed(self, by: str, reason: str, **fields: Any) -> TrafficPolicy:
        """A new revision with ``fields`` changed, validated."""
        policy = replace(
            self,
            revision=self.revision + 1,
            updated_at=time.time(),
            updated_by=by,
            reason=reason,
            **fields,
        )
        policy.validate()
        return policy

    def with_canary(self, version: int, percent: float, by: str) -> TrafficPolicy:
        """Send ``percent`` of the callers to ``version``."""
        return self.changed(
            by, f"canary v{version} at {percent:g} %", canary=version, canary_percent=percent
        )

    def promoted(self, by: str) -> TrafficPolicy:
        """The canary becomes stable (100 %); the old stable is kept for a rollback."""
        if self.canary is None:
            raise errors.Conflict("there is no canary to promote")
        return self.changed(
            by,
            f"promoted v{self.canary} over v{self.stable}",
            stable=self.canary,
            canary=None,
            canary_percent=0.0,
            previous_stable=self.stable,
        )

    def rolled_back(self, by: str, reason: str = "") -> TrafficPolicy:
        """Drop the canary; with no canary, return to the previous stable version."""
        if self.canary is not None:
            return self.changed(
                by,
                reason or f"rolled back canary v{self.canary}",
                canary=None,
                canary_percent=0.0,
            )
        if self.previous_stable is None:
            raise errors.Conflict("nothing to roll back: no canary and no previous stable version")
        return self.changed(
            by,
            reason or f"rolled back v{self.stable} to v{self.previous_stable}",
            stable=self.previous_stable,
            previous_stable=None,
        )

    def validate(self) -> None:
        """InvalidRequest when the policy contradicts itself."""
        if not 0 <= self.canary_percent <= 100:
            raise errors.InvalidRequest("canary_percent must lie in 0..100")
        if not 0 < self.shadow_percent <= 100:
            raise errors.InvalidRequest("shadow_percent must lie in (0, 100]")
        if self.canary is not None and self.canary == self.stable:
            raise errors.InvalidRequest(f"v{self.stable} is stable already; it cannot be canary")
        if self.canary is None and self.canary_percent:
            raise errors.InvalidRequest("canary_percent needs a canary version")
        if self.shadow is not None and self.shadow in (self.stable, self.canary):
            raise errors.InvalidRequest(f"v{self.shadow} serves traffic; it cannot also shadow it")

    def to_json(self) -> dict[str, Any]:
        """The policy as stored and as the admin API shows it."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrafficPolicy:
        """Read a stored policy (unknown keys are ignored, so old gateways read newer files)."""
        known = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
        policy = cls(**known)
        policy.validate()
        return policy


def _rank(canary: int, caller: str) -> int:
    digest = hashlib.sha256(f"{canary}:{caller}".encode()).digest()
    return int.from_bytes(digest[:8], "big")
