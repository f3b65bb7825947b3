"""The embedded tritonserver: clear failures, clean stops, no orphans."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from devtools import triton as embedded
from devtools.ports import free_ports
from devtools.process import process_group_members
from devtools.triton import (
    EmbeddedTriton,
    EmbeddedTritonError,
    ModelLoadError,
    PortInUseError,
    Ports,
)
from tests.conftest import wait_for


def test_port_in_use_is_reported(cpu_repository: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http, grpc_port, metrics = taken.getsockname()[1], *free_ports(2)
        server = EmbeddedTriton(
            cpu_repository,
            tmp_path,
            models=["text_embedding_v1"],
            ports=Ports(http, grpc_port, metrics),
        )
        with pytest.raises(PortInUseError, match="in use"):
            server.start()
    assert server.process is not None and server.process.poll() is not None


def test_model_that_fails_to_load_is_named(cpu_repository: Path, tmp_path: Path) -> None:
    broken = tmp_path / "repo"
    shutil.copytree(cpu_repository, broken, symlinks=True)
    forest_py = broken / "forest_v1" / "1" / "model.py"
    forest_py.write_text(forest_py.read_text() + "\nimport a_module_that_does_not_exist\n")
    server = EmbeddedTriton(broken, tmp_path / "work", models=["text_regression_v1"])
    with pytest.raises(ModelLoadError) as failure:
        server.start()
    assert "a_module_that_does_not_exist" in str(failure.value)
    assert "server log tail" in str(failure.value)


def test_numpy_2_is_refused_before_starting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.1.0")
    with pytest.raises(EmbeddedTritonError, match="needs numpy<2"):
        EmbeddedTriton(tmp_path, tmp_path).start()


def test_python_without_shared_library_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sysconfig.get_config_var
    monkeypatch.setattr(
        sysconfig,
        "get_config_var",
        lambda name: 0 if name == "Py_ENABLE_SHARED" else real(name),
    )
    with pytest.raises(EmbeddedTritonError, match="--enable-shared"):
        embedded._libpython_dir()


def test_stop_is_clean(own_triton: EmbeddedTriton) -> None:
    assert own_triton.is_ready()
    assert own_triton.stop() == 0
    assert not own_triton.is_ready()


def test_stop_after_a_sigkill_leaves_no_stub_process_and_no_shm_region(
    own_triton: EmbeddedTriton,
) -> None:
    assert own_triton.process is not None
    group = own_triton.process.pid
    assert own_triton.shm_regions(), "the Python backend should hold regions under our prefix"
    os.kill(group, signal.SIGKILL)  # the server alone: its stubs stay in its process group
    own_triton.process.wait()
    own_triton.stop()
    wait_for(lambda: not process_group_members(group), 10, "the stub processes to be gone")
    assert not own_triton.shm_regions()


def test_server_dies_with_its_parent(cpu_repository: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import pathlib, time
                from devtools.triton import EmbeddedTriton
                server = EmbeddedTriton(pathlib.Path({str(cpu_repository)!r}),
                                        pathlib.Path({str(tmp_path / "work")!r}),
                                        models=["text_embedding_v1"]).start()
                pathlib.Path({str(pid_file)!r}).write_text(str(server.process.pid))
                time.sleep(600)
                """
            ),
        ],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
        server_pid = int(pid_file.read_text())
        parent.kill()  # SIGKILL: no atexit, no cleanup code runs in the parent
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid), "tritonserver outlived its parent"
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose; it only waits for init to reap it.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()
