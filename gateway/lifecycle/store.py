"""Where the traffic policy lives, so that it outlives a gateway restart and every replica in
front of one Triton agrees on it.

:class:`FilePolicyStore` keeps it in one JSON file on a volume the replicas share (compose: a named
volume; Kubernetes: a ReadWriteMany volume). A write is a compare-and-swap on the revision under
an exclusive ``flock``, and lands by an atomic rename: a reader never sees half a file, and of two
replicas changing the policy at once one wins and the other gets 409. Replicas re-read the file
when it changes (every readiness poll). The file also keeps the last :data:`HISTORY` policies: the
rollout's history (who changed what, why, when), the same on every replica.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gateway import errors
from gateway.lifecycle.policy import TrafficPolicy

HISTORY = 50


@dataclass(frozen=True)
class StoredPolicy:
    """The current policy and the ones before it (newest first)."""

    policy: TrafficPolicy | None
    history: tuple[TrafficPolicy, ...] = field(default_factory=tuple)


class PolicyStore(Protocol):
    """A shared, durable home of the traffic policy."""

    def load(self) -> StoredPolicy:
        """The stored policy (None before the first write) and its history."""

    def swap(self, expected_revision: int | None, policy: TrafficPolicy) -> StoredPolicy:
        """Store ``policy`` if the stored revision is still ``expected_revision`` (None: nothing
        stored yet) and return what is stored now; raise :class:`errors.Conflict` otherwise."""


class MemoryPolicyStore:
    """A store of this process alone (no ``policy_path`` configured): lost at restart."""

    def __init__(self) -> None:
        self._stored = StoredPolicy(None)

    def load(self) -> StoredPolicy:
        """The policy held in memory."""
        return self._stored

    def swap(self, expected_revision: int | None, policy: TrafficPolicy) -> StoredPolicy:
        """Compare-and-swap in memory."""
        self._stored = _swapped(self._stored, expected_revision, policy)
        return self._stored


class FilePolicyStore:
    """The policy in a JSON file shared by the replicas (see the module's docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        # The file's identity when last parsed, and what it held: every readiness poll loads
        # the policy, and a file replaced by a rename has a new inode.
        self._seen: tuple[int, int, int] | None = None
        self._cached = StoredPolicy(None)

    def load(self) -> StoredPolicy:
        """The stored policy (an absent file: nothing stored yet); parsed only when the file
        was replaced since the last load."""
        try:
            with self.path.open("rb") as file:
                stat = os.fstat(file.fileno())
                identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if identity == self._seen:
                    return self._cached
                data = json.loads(file.read())
        except FileNotFoundError:
            return StoredPolicy(None)
        self._cached = StoredPolicy(
            TrafficPolicy.from_json(data["policy"]),
            tuple(TrafficPolicy.from_json(item) for item in data.get("history", [])),
        )
        self._seen = identity
        return self._cached

    def swap(self, expected_revision: int | None, policy: TrafficPolicy) -> StoredPolicy:
        """Compare-and-swap under the lock; the new file lands by an atomic rename."""
        with self._locked():
            stored = _swapped(self.load(), expected_revision, policy)
            document = {
                "policy": policy.to_json(),
                "history": [item.to_json() for item in stored.history],
            }
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name)
            try:
                with os.fdopen(handle, "w") as file:
                    json.dump(document, file, indent=2)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, self.path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        return stored

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _swapped(
    stored: StoredPolicy, expected_revision: int | None, policy: TrafficPolicy
) -> StoredPolicy:
    current = stored.policy
    revision = None if current is None else current.revision
    if revision != expected_revision:
        raise errors.Conflict(
            f"the traffic policy changed meanwhile (revision {revision}, expected "
            f"{expected_revision}); read it again and retry"
        )
    history = (policy, *stored.history)[:HISTORY]
    return StoredPolicy(policy, history)
