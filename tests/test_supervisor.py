"""The Triton supervisor: restarts after a crash on the same ports, backs off, leaves nothing behind.

The backoff and the supervisor's loop are checked first over a stand-in server (a ``sleep``
process); the tests that use ``own_triton`` kill a real tritonserver.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest

from devtools.process import process_group_members, processes_running
from devtools.supervisor import Backoff, TritonSupervisor
from devtools.triton import EmbeddedTriton, EmbeddedTritonError
from tests.conftest import wait_for

# --- the backoff -----------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_maximum() -> None:
    backoff = Backoff(initial_s=0.5, maximum_s=10.0, stable_s=30.0)
    delays = [backoff.next_delay(up_for_s=1.0) for _ in range(7)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_backoff_resets_after_a_stable_period() -> None:
    backoff = Backoff(initial_s=0.5, maximum_s=10.0, stable_s=30.0)
    assert [backoff.next_delay(0.0) for _ in range(3)] == [0.5, 1.0, 2.0]
    # Up for the whole stable period: the next crash is a new story.
    assert backoff.next_delay(30.0) == 0.5
    assert backoff.next_delay(29.9) == 1.0


def test_backoff_refuses_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="inconsistent"):
        Backoff(initial_s=5.0, maximum_s=1.0)


# --- the loop, over a stand-in server ----------------------------------------------------------


class SleepServer:
    """A stand-in for EmbeddedTriton: its "server" is a ``sleep`` process; restarts can fail."""

    def __init__(self, failing_restarts: int = 0) -> None:
        self.failing_restarts = failing_restarts
        self.launched: list[subprocess.Popen[bytes]] = []
        self.restart_calls = 0
        self.ready_after: float | None = None
        self._launch()

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self.launched[-1] if self.launched else None

    def _launch(self) -> None:
        self.launched.append(subprocess.Popen(["sleep", "60"]))
        self.ready_after = 0.0

    def restart(self, abort: threading.Event | None = None) -> SleepServer:
        self.restart_calls += 1
        self.stop()
        if self.restart_calls <= self.failing_restarts:
            # A start that fails leaves a dead process behind, as a real one does.
            self.launched.append(subprocess.Popen(["true"]))
            self.launched[-1].wait()
            raise EmbeddedTritonError("model failed to load")
        self._launch()
        return self

    def stop(self, timeout: float = 15.0) -> int | None:
        for process in self.launched:
            if process.poll() is None:
                process.kill()
            process.wait()
        return self.process.returncode if self.process else None

    def crash(self) -> None:
        assert self.process is not None
        self.process.kill()


def running_again(server: SleepServer, before: subprocess.Popen[bytes] | None) -> bool:
    """Whether ``server`` runs a process other than ``before``."""
    process = server.process
    return process is not before and process is not None and process.poll() is None


def restarted(supervisor: TritonSupervisor, count: int) -> bool:
    """Whether the supervisor has done ``count`` restarts and the last one is ready."""
    restarts = supervisor.restarts
    return len(restarts) == count and restarts[-1].ready_at is not None


@pytest.fixture
def sleeper() -> Iterator[SleepServer]:
    server = SleepServer()
    yield server
    server.stop()


def fast() -> Backoff:
    """A fresh backoff (it keeps state) with short delays."""
    return Backoff(initial_s=0.05, maximum_s=0.2, stable_s=60.0)


def test_each_crash_is_restarted_after_a_growing_delay(sleeper: SleepServer) -> None:
    with TritonSupervisor(sleeper, fast(), poll_s=0.01) as supervisor:
        for crashes in range(1, 5):
            before = sleeper.process
            sleeper.crash()
            wait_for(partial(running_again, sleeper, before), 5, f"restart {crashes}")
        restarts = supervisor.restarts
    assert [restart.delay_s for restart in restarts] == [0.05, 0.1, 0.2, 0.2]
    assert all(restart.exit_code == -signal.SIGKILL for restart in restarts)
    for restart in restarts:
        assert restart.ready_at is not None and restart.error is None
        assert restart.ready_at - restart.exited_at >= restart.delay_s


def test_a_failing_restart_is_retried_with_backoff(sleeper: SleepServer) -> None:
    sleeper.failing_restarts = 2
    with TritonSupervisor(sleeper, fast(), poll_s=0.01) as supervisor:
        sleeper.crash()
        wait_for(lambda: sleeper.restart_calls == 3, 5, "a third restart")
        wait_for(lambda: supervisor.restarts[-1].ready_at is not None, 5, "the server up again")
        restarts = supervisor.restarts
    assert [restart.error is not None for restart in restarts] == [True, True, False]
    assert [restart.delay_s for restart in restarts] == [0.05, 0.1, 0.2]
    # A failed start never was up: nothing resets the backoff.
    assert restarts[1].up_for_s == restarts[2].up_for_s == 0.0


def test_stop_during_the_backoff_delay_returns_at_once(sleeper: SleepServer) -> None:
    supervisor = TritonSupervisor(sleeper, Backoff(initial_s=30.0, maximum_s=30.0), poll_s=0.01)
    supervisor.start()
    sleeper.crash()
    wait_for(lambda: supervisor.restarts, 5, "the crash to be seen")
    started = time.monotonic()
    supervisor.stop()
    assert time.monotonic() - started < 2
    assert sleeper.restart_calls == 0


# --- a real tritonserver ------------------------------------------------------------------------


def test_a_killed_triton_comes_back_on_the_same_ports_and_repeated_crashes_back_off(
    own_triton: EmbeddedTriton,
) -> None:
    ports = own_triton.ports
    backoff = Backoff(initial_s=0.5, maximum_s=10.0, stable_s=60.0)
    with TritonSupervisor(own_triton, backoff) as supervisor:
        for kill in (1, 2):
            assert own_triton.process is not None
            dead, regions = own_triton.process.pid, set(own_triton.shm_regions())
            # The server alone, as a crash would: its Python-backend stubs stay behind.
            os.kill(dead, signal.SIGKILL)
            wait_for(partial(restarted, supervisor, kill), 90, f"Triton back after kill {kill}")
            assert own_triton.ports == ports
            assert own_triton.process is not None and own_triton.process.pid != dead
            assert own_triton.is_ready()
            # The dead server's stubs were ended and its regions removed by the restart.
            assert not process_group_members(dead)
            assert regions and not regions & set(own_triton.shm_regions())
        restarts = supervisor.restarts
    # The second crash came before the server had been up for the stable period: it waited longer.
    assert [restart.delay_s for restart in restarts] == [0.5, 1.0]
    assert all(restart.exit_code == -signal.SIGKILL for restart in restarts)
    assert all(restart.start_to_ready_s for restart in restarts)


def test_stopping_leaves_no_process_and_no_region(own_triton: EmbeddedTriton) -> None:
    assert own_triton.process is not None
    workdir = own_triton.workdir
    supervisor = TritonSupervisor(own_triton, Backoff(initial_s=0.1)).start()
    try:
        os.kill(own_triton.process.pid, signal.SIGKILL)
        wait_for(partial(restarted, supervisor, 1), 90, "Triton to be restarted")
        # A server the supervisor's thread launched is stopped cleanly too (SIGTERM, rc 0),
        # not killed by the parent-death signal when that thread ends.
        relaunched = own_triton.process
        supervisor.stop()
        assert relaunched is not None and relaunched.returncode == 0
    finally:
        supervisor.stop()
        own_triton.stop()
    assert not processes_running(workdir)
    assert not own_triton.shm_regions()
    assert not own_triton.is_ready()


def test_stopping_during_a_restart_abandons_it(own_triton: EmbeddedTriton) -> None:
    assert own_triton.process is not None
    supervisor = TritonSupervisor(own_triton, Backoff(initial_s=0.1)).start()
    first = own_triton.process
    try:
        os.kill(first.pid, signal.SIGKILL)
        # The new server is launched but not ready yet (loading its models takes seconds).
        wait_for(lambda: own_triton.process is not first, 10, "the restart to launch a server")
        started = time.monotonic()
        supervisor.stop()
        assert time.monotonic() - started < 5
        assert supervisor.restarts[-1].ready_at is None
    finally:
        supervisor.stop()
        own_triton.stop()
    assert not processes_running(own_triton.workdir)
    assert not own_triton.shm_regions()
