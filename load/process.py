"""A child server process that cannot outlive the tool (own process group, PDEATHSIG, atexit)."""

from __future__ import annotations

import atexit
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.triton.embedded import launch_logged_child, log_tail, stop_process_group


class ServerStartError(RuntimeError):
    """The child exited or never became healthy; the message quotes its log."""


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

    def start(self) -> ManagedServer:
        """Launch, block until healthy; ``ready_after`` = seconds from launch to healthy."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self.process = launch_logged_child(self.command, self.env, self.log_path)
        atexit.register(self.stop)
        deadline = started + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"{self.command[0]} exited with rc {self.process.returncode}\n{self.log_tail()}"
                )
            if self._healthy():
                self.ready_after = time.monotonic() - started
                return self
            time.sleep(0.05)
        self.stop()
        raise ServerStartError(
            f"not healthy after {self.startup_timeout_s:.0f} s\n{self.log_tail()}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=1) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the child's output."""
        return log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``timeout_s``; return the exit code."""
        if self.process is None:
            return None
        code = stop_process_group(self.process, timeout_s)
        atexit.unregister(self.stop)
        return code

    def __enter__(self) -> ManagedServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus ``extra``."""
    env = dict(os.environ)
    env.update(extra)
    return env
