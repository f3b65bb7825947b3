"""Keep an embedded Triton running: restart it after a crash, with backoff, on the same ports.

``python -m gateway dev`` and ``python -m load chaos`` use it. One thread watches the server
process. When the process has exited (a crash, a SIGKILL, the OOM killer), the thread waits a
backoff delay, then calls :meth:`EmbeddedTriton.restart`, which stops what is left of the dead
server (its Python-backend stubs, its /dev/shm regions) and starts it again on the same ports. The
gateway needs no signal: its readiness drops at its next poll while Triton is away and returns
after it has registered its shared memory again and warmed up.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any, Protocol

from devtools.triton import EmbeddedTritonError, StartAborted

log = logging.getLogger(__name__)


class Restartable(Protocol):
    """What the supervisor needs of a server (:class:`devtools.triton.EmbeddedTriton` has it)."""

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The running (or last) server process."""

    @property
    def ready_after(self) -> float | None:
        """Seconds from launch to ready of the last start."""

    def restart(self, abort: threading.Event | None = None) -> object:
        """Stop what is left of the server and start it again (the same ports)."""

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the server and whatever it left behind."""


@dataclass
class Backoff:
    """Delays between restarts: ``initial_s``, times ``factor`` after each one, at most
    ``maximum_s``; back to ``initial_s`` once a server has stayed up ``stable_s``.

    The reset keeps a server that crashes now and then restarting at once, while one that cannot
    stay up (a broken model, a port taken) is retried ever more slowly instead of in a hot loop.
    """

    initial_s: float = 0.5
    maximum_s: float = 10.0
    factor: float = 2.0
    stable_s: float = 10.0
    _next_s: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.maximum_s or self.factor < 1 or self.stable_s < 0:
            raise ValueError(f"inconsistent backoff: {self}")
        self._next_s = self.initial_s

    def next_delay(self, up_for_s: float) -> float:
        """The wait before the next restart of a server that was up for ``up_for_s`` seconds
        (0 for one that never became ready)."""
        if up_for_s >= self.stable_s:
            self._next_s = self.initial_s
        delay = self._next_s
        self._next_s = min(self.maximum_s, delay * self.factor)
        return delay


@dataclass
class Restart:
    """One exit of the server and what the supervisor did about it (times: ``time.monotonic``)."""

    exited_at: float
    exit_code: int | None
    # How long the server had been ready when it exited; 0 when the previous restart failed.
    up_for_s: float
    delay_s: float
    ready_at: float | None = None
    # Launch to ready of the restarted server (its model warm-ups included).
    start_to_ready_s: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


class TritonSupervisor:
    """Restarts ``server`` whenever its process has exited, until :meth:`stop`.

    Use it around a started server, and stop it before the server::

        server.start()
        with TritonSupervisor(server):
            ...
        server.stop()
    """

    def __init__(
        self, server: Restartable, backoff: Backoff | None = None, poll_s: float = 0.1
    ) -> None:
        self.server = server
        self.backoff = backoff or Backoff()
        self.poll_s = poll_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._restarts: list[Restart] = []
        self._ready_since: float | None = None

    @property
    def restarts(self) -> list[Restart]:
        """Every restart so far, the last one possibly still in progress (``ready_at`` None)."""
        with self._lock:
            return list(self._restarts)

    def start(self) -> TritonSupervisor:
        """Start watching the (started) server in a daemon thread."""
        if self.server.process is None:
            raise EmbeddedTritonError("start the server before supervising it")
        if self._thread is not None:
            raise RuntimeError("the supervisor is already running")
        self._ready_since = time.monotonic()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._watch, name="triton-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop restarting (a restart under way is abandoned); returns once the thread has ended.

        The server itself is left to its owner's ``stop()``, except one this thread started: that
        one is stopped here (see :meth:`_watch`).
        """
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("the Triton supervisor did not stop within %.0f s", timeout_s)
            self._thread = None

    def _watch(self) -> None:
        started_here = False
        try:
            while not self._stopping.is_set():
                process = self.server.process
                if process is not None and process.poll() is None:
                    self._stopping.wait(self.poll_s)
                    continue
                started_here = self._restart(process.returncode if process else None)
        finally:
            # PR_SET_PDEATHSIG follows the thread that forked the child, not the process: a
            # server this thread started would be SIGKILLed the moment the thread ends. Stop it
            # here instead, with SIGTERM, so that it shuts down cleanly.
            if started_here:
                self.server.stop()

    def _restart(self, exit_code: int | None) -> bool:
        """Wait the backoff delay, then restart; whether a new server process was launched."""
        now = time.monotonic()
        up_for = now - self._ready_since if self._ready_since is not None else 0.0
        self._ready_since = None
        restart = Restart(now, exit_code, up_for, self.backoff.next_delay(up_for))
        with self._lock:
            self._restarts.append(restart)
        log.warning(
            "tritonserver exited (rc %s) after %.1f s up; restarting in %.1f s",
            exit_code,
            up_for,
            restart.delay_s,
        )
        if self._stopping.wait(restart.delay_s):
            return False
        try:
            self.server.restart(abort=self._stopping)
        except StartAborted:
            return True
        except EmbeddedTritonError as exc:
            # The next round sees the process gone and retries after a longer delay.
            restart.error = str(exc)
            log.error("restarting tritonserver failed: %s", exc)
            return True
        self._ready_since = restart.ready_at = time.monotonic()
        restart.start_to_ready_s = self.server.ready_after
        log.warning(
            "tritonserver restarted on the same ports, ready after %.1f s",
            restart.start_to_ready_s or 0.0,
        )
        return True

    def __enter__(self) -> TritonSupervisor:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
