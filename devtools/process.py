"""Child servers that cannot outlive us: own process group, PDEATHSIG, atexit, group stop.

One launch (:func:`launch_logged_child`), one readiness wait (:meth:`ManagedServer.start`) and one
stop (:func:`stop_process_group`) serve the embedded Triton, the load tool's servers and the tests.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
LOG_TAIL_LINES = 40
# How long a stop waits for the SIGKILLed members of a group to be gone.
_GROUP_EXIT_TIMEOUT_S = 5.0


class ServerStartError(RuntimeError):
    """The child exited or never became healthy; the message quotes its log."""

    def __init__(self, message: str, exited: bool, aborted: bool = False) -> None:
        super().__init__(message)
        # True when the child exited before it became healthy, False when it timed out.
        self.exited = exited
        # True when the caller gave up on the start (the child was stopped, nothing failed).
        self.aborted = aborted


def die_with_parent() -> None:
    """``preexec_fn`` for a child that must not outlive us: the kernel SIGKILLs it when we die."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def launch_logged_child(
    command: Sequence[str], env: Mapping[str, str] | None, log_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own process group, output to ``log_path``, dying with us."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # A preexec_fn makes Python fork() instead of vfork(), and fork() in a process whose gRPC
    # threads are busy (a gateway or a Triton client in the same process) can abort the child
    # before it execs. util-linux's setpriv sets the same parent-death signal with no Python code
    # in the child; the preexec_fn stays as the fallback where setpriv is missing.
    setpriv = shutil.which("setpriv")
    argv = [setpriv, "--pdeathsig", "KILL", "--", *command] if setpriv else list(command)
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv,
            env=dict(env) if env is not None else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=None if setpriv else die_with_parent,
        )


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a child's log."""
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def stop_process_group(process: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM ``process``'s group, SIGKILL it after ``timeout`` (and whatever of the group outlived
    the leader); return the leader's exit code."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # Children can outlive the leader in its group (Triton's Python-backend stubs do when the
    # server was SIGKILLed): end whatever is left of the group, leader alive or not.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    # A SIGKILL is delivered asynchronously: wait until the group is really gone, so that a
    # caller checking for leftovers right after this returns finds none.
    deadline = time.monotonic() + _GROUP_EXIT_TIMEOUT_S
    while process_group_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return process.returncode


def _live_processes() -> list[tuple[int, list[str]]]:
    """(pid, fields of /proc/PID/stat after the command name) of every process but zombies."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # it ended while we looked
            continue
        # fields[0] is the state: a zombie is as good as gone, it only waits to be reaped.
        if fields and fields[0] != "Z":
            found.append((int(stat.parent.name), fields))
    return found


def process_group_members(group: int) -> list[int]:
    """The live processes of process group ``group`` (e.g. the stubs a killed server left)."""
    return [pid for pid, fields in _live_processes() if int(fields[2]) == group]


def processes_running(path: Path) -> list[int]:
    """The live processes whose command line mentions ``path`` (a server's work directory)."""
    needle = str(path).encode()
    found = []
    for pid, _ in _live_processes():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in command:
            found.append(pid)
    return found


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` (resident now) and ``VmHWM`` (peak resident) of ``pid`` in KiB, from
    /proc/PID/status; empty once the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0])
    return found


def answers_ok(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``url`` answers 200 right now."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus ``extra``."""
    env = dict(os.environ)
    env.update(extra)
    return env


class ManagedServer:
    """Start a command, wait until ``health_url`` answers 200, stop it with SIGTERM then SIGKILL."""

    def __init__(
        self,
        command: Sequence[str],
        health_url: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 120.0,
    ) -> None:
        self.command = list(command)
        self.health_url = health_url
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_after: float | None = None

    def start(self, abort: threading.Event | None = None) -> ManagedServer:
        """Launch, block until healthy; ``ready_after`` = seconds from launch to healthy.

        Raises :class:`ServerStartError` (the child stopped) when it exits first, times out, or
        ``abort`` is set meanwhile (a supervisor that is shutting down must not wait for a start).
        """
        started = time.monotonic()
        self.ready_after = None
        self.process = launch_logged_child(self.command, self.env, self.log_path)
        atexit.register(self.stop)
        deadline = started + self.startup_timeout_s
        while time.monotonic() < deadline:
            if abort is not None and abort.is_set():
                self.stop()
                raise ServerStartError(
                    f"{Path(self.command[0]).name}: start abandoned", exited=False, aborted=True
                )
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"{Path(self.command[0]).name} exited with rc {self.process.returncode}\n"
                    f"--- log tail ---\n{self.log_tail()}",
                    exited=True,
                )
            if answers_ok(self.health_url):
                self.ready_after = time.monotonic() - started
                return self
            time.sleep(0.05)
        self.stop()
        raise ServerStartError(
            f"{Path(self.command[0]).name} not healthy after {self.startup_timeout_s:.0f} s\n"
            f"--- log tail ---\n{self.log_tail()}",
            exited=False,
        )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the child's output."""
        return log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``timeout_s``; return the exit code."""
        if self.process is None:
            return None
        code = stop_process_group(self.process, timeout_s)
        atexit.unregister(self.stop)
        return code

    def kill(self) -> None:
        """SIGKILL the whole process group at once (for failure tests)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> ManagedServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
