"""A real ``tritonserver`` (2.51, from the ``nvidia-pytriton`` wheel) run as a child process.

Used by ``make run`` (``python -m gateway dev``), the tests and the load tool on machines with no
GPU and no Docker. The server is bound to 127.0.0.1 on free ports, started in its own process
group, killed if this process dies (PR_SET_PDEATHSIG), and stopped with SIGTERM then SIGKILL
(``devtools.process``). Every failure names its cause and quotes the tail of the server log.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from devtools.ports import free_ports
from devtools.process import ManagedServer, ServerStartError, answers_ok, log_tail

DEFAULT_MODELS = ("text_regression_v1", "text_embedding_v1")
# Several stub processes share few cores: OpenMP threads that spin while idle (libgomp's default)
# take cores from the other stages. Measured on 2 cores with single-threaded encoders it is a small
# gain (121 -> 129 texts/s at 16 clients, docs/benchmarks.md); it matters more for multi-threaded pools.
CPU_RUNTIME_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
SHM_DIR = Path("/dev/shm")
# Triton 2.51's Python backend can abort while starting its stubs on a starved machine
# ("boost::interprocess::lock_exception", SIGABRT; an upstream bug, triton-inference-server/server
# #8882): such a crash is not the configuration's fault, so a start tries once more.
CRASH_RETRIES = 1
log = logging.getLogger(__name__)


class EmbeddedTritonError(RuntimeError):
    """The embedded server could not be prepared, started or kept running."""


class StartAborted(EmbeddedTritonError):
    """A start was abandoned on request (``abort`` set) and the half-started server stopped."""


class PortInUseError(EmbeddedTritonError):
    """One of the requested ports is taken by another process."""


class StartupCrash(EmbeddedTritonError):
    """The server died of a signal while starting (not a configuration error)."""


class ModelLoadError(EmbeddedTritonError):
    """A model failed to load; ``model`` names it."""

    def __init__(self, model: str, reason: str, log_tail: str) -> None:
        super().__init__(
            f"model '{model}' failed to load: {reason}\n--- server log tail ---\n{log_tail}"
        )
        self.model = model


@dataclass(frozen=True)
class Ports:
    """The three ports one server listens on (all on 127.0.0.1)."""

    http: int
    grpc: int
    metrics: int


def _pytriton_dir() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise EmbeddedTritonError(
            "the tritonserver binary comes from the nvidia-pytriton wheel, which is not installed "
            "(pip install nvidia-pytriton==0.7.0, or run `make run`, which installs it)"
        )
    return Path(spec.origin).parent


def _libpython_dir() -> Path:
    libdir = sysconfig.get_config_var("LIBDIR")
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not libdir:
        raise EmbeddedTritonError(
            f"this Python ({sys.executable}) was built without --enable-shared: it has no "
            "libpython shared library, which Triton's Python-backend stub must load. Use a Python "
            "built with --enable-shared (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared)."
        )
    # The stub links the versioned name (libpython3.X.so.1.0, INSTSONAME); the unversioned
    # LDLIBRARY is only a development symlink, missing where the -dev package is not installed.
    names = [
        name
        for name in (sysconfig.get_config_var("INSTSONAME"), sysconfig.get_config_var("LDLIBRARY"))
        if name
    ]
    if not any((Path(libdir) / name).exists() for name in names):
        raise EmbeddedTritonError(
            f"the shared library {' or '.join(names)} is missing from {libdir} (Debian and "
            "Ubuntu: the libpython3.X package)"
        )
    return Path(libdir)


def _check_numpy(pythonpath: Sequence[Path] = ()) -> None:
    """Refuse numpy 2 where the server's stubs will import numpy from (``pythonpath`` first)."""
    dirs = [str(p) for p in pythonpath]
    found = (
        next(iter(importlib.metadata.distributions(name="numpy", path=dirs)), None)
        if dirs
        else None
    )
    try:
        version = found.version if found is not None else importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        raise EmbeddedTritonError("numpy is not installed in this environment") from None
    if int(version.split(".")[0]) >= 2:
        raise EmbeddedTritonError(
            f"numpy {version} is installed; Triton 2.51's Python backend needs numpy<2 (with 2.x "
            "every output fails with 'output tensor shape does not match size of output'). "
            "Install 'numpy<2'."
        )


def prepare_server(workdir: Path) -> Path:
    """Copy pytriton's server tree into ``workdir`` with the stub of the running Python; return the binary."""
    source = _pytriton_dir() / "tritonserver"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = source / "python_backend_stubs" / python_version / "triton_python_backend_stub"
    if not stub.exists():
        raise EmbeddedTritonError(
            f"nvidia-pytriton ships no Python-backend stub for Python {python_version}"
        )
    target = workdir / "tritonserver"
    marker = target / ".prepared-from"
    stamp = f"{source}:{python_version}"
    if not (marker.exists() and marker.read_text() == stamp):
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, symlinks=True)
        shutil.copy2(stub, target / "backends" / "python" / "triton_python_backend_stub")
        marker.write_text(stamp)
    return target / "bin" / "tritonserver"


class EmbeddedTriton:
    """One ``tritonserver`` child process serving a model repository on 127.0.0.1."""

    def __init__(
        self,
        model_repository: Path,
        workdir: Path,
        models: Sequence[str] = DEFAULT_MODELS,
        ports: Ports | None = None,
        startup_timeout: float = 120.0,
        extra_args: Sequence[str] = (),
        server_pythonpath: Sequence[Path] = (),
    ) -> None:
        self.model_repository = model_repository
        self.workdir = workdir
        self.models = tuple(models)
        self._fixed_ports = ports
        self.ports = ports or Ports(*free_ports(3))
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        # Put ahead of PYTHONPATH for the server and its Python-backend stubs only, e.g. a
        # numpy<2 for the stubs where this process itself runs numpy 2 (the GPU check).
        self.server_pythonpath = tuple(server_pythonpath)
        self.log_path = workdir / "tritonserver.log"
        # The Python backend's regions in /dev/shm start with this, so that the ones a killed
        # server leaves behind can be found and removed by name.
        self.shm_prefix = f"textscore-triton-{secrets.token_hex(4)}_"
        self._server: ManagedServer | None = None

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The running (or last) server process."""
        return self._server.process if self._server is not None else None

    @property
    def ready_after(self) -> float | None:
        """Seconds from launch to ready, once ready."""
        return self._server.ready_after if self._server is not None else None

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint."""
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint."""
        return f"127.0.0.1:{self.ports.http}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics endpoint."""
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    @property
    def ready_url(self) -> str:
        """The HTTP readiness endpoint (200 once the server and its loaded models are ready)."""
        return f"http://{self.http_url}/v2/health/ready"

    def command(self, binary: Path) -> list[str]:
        """The server's command line."""
        args = [
            str(binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={binary.parent.parent / 'backends'}",
            "--model-control-mode=explicit",
            *(f"--load-model={model}" for model in self.models),
            "--http-address=127.0.0.1",
            f"--http-port={self.ports.http}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.ports.grpc}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.ports.metrics}",
            "--allow-metrics=true",
            "--exit-on-error=true",
            "--strict-readiness=true",
            "--log-verbose=0",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        """The environment the server and its Python-backend stubs need."""
        env = dict(os.environ)
        lib_dirs = [str(_libpython_dir()), str(_pytriton_dir().parent / "nvidia_pytriton.libs")]
        if env.get("LD_LIBRARY_PATH"):
            lib_dirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
        # Python-backend models must import this environment's packages.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        if self.server_pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                [*(str(p) for p in self.server_pythonpath), *filter(None, [env.get("PYTHONPATH")])]
            )
        env.update({k: v for k, v in CPU_RUNTIME_ENV.items() if k not in env})
        return env

    def start(self, abort: threading.Event | None = None) -> EmbeddedTriton:
        """Start the server and wait until it and its models are ready (retries taken ports).

        ``abort``, once set, stops a start that is still waiting (:class:`StartAborted`).
        """
        return self._start(1 if self._fixed_ports else 3, abort)

    def restart(self, abort: threading.Event | None = None) -> EmbeddedTriton:
        """Stop what is left of the server (after a crash: its stubs and its /dev/shm regions),
        then start it again on the same ports.

        The ports never move on a restart, since clients (the gateway) keep pointing at them: a
        port taken meanwhile fails the restart (:class:`PortInUseError`) instead.
        """
        self.stop()
        # Keep the crashed server's log for one restart: it says why it died.
        if self.log_path.exists():
            self.log_path.replace(self.log_path.with_suffix(".previous.log"))
        return self._start(1, abort)

    def _start(self, attempts_left: int, abort: threading.Event | None) -> EmbeddedTriton:
        _check_numpy(self.server_pythonpath)
        self.workdir.mkdir(parents=True, exist_ok=True)
        binary = prepare_server(self.workdir)
        port_attempts_left = attempts_left
        crash_retries_left = CRASH_RETRIES
        while True:
            self._server = ManagedServer(
                self.command(binary),
                self.ready_url,
                self.log_path,
                env=self.environment(),
                startup_timeout_s=self.startup_timeout,
            )
            try:
                self._server.start(abort)
                return self
            except ServerStartError as exc:
                if exc.aborted:
                    self.stop()
                    raise StartAborted("tritonserver start abandoned (stopping)") from None
                failure = self._failure(exc)
                self.stop()
                if isinstance(failure, PortInUseError) and port_attempts_left > 1:
                    port_attempts_left -= 1
                    self.ports = Ports(*free_ports(3))
                elif isinstance(failure, StartupCrash) and crash_retries_left > 0:
                    crash_retries_left -= 1
                    log.warning(
                        "tritonserver crashed while starting; starting it again: %s", failure
                    )
                else:
                    raise failure from None

    def log_tail(self) -> str:
        """The last lines of the server log."""
        return log_tail(self.log_path)

    def _failure(self, exc: ServerStartError) -> EmbeddedTritonError:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        tail = self.log_tail()
        if re.search(r"already in use|address in use", text, re.IGNORECASE):
            return PortInUseError(
                f"a port of {self.ports} is in use\n--- server log tail ---\n{tail}"
            )
        failed = re.search(r"failed to load '([^']+)' version \d+: (.*)", text)
        if failed:
            return ModelLoadError(failed.group(1), failed.group(2).strip(), tail)
        code = self.process.returncode if self.process else None
        if exc.exited and code is not None and code < 0:
            return StartupCrash(
                f"tritonserver died of signal {-code} while starting\n"
                f"--- server log tail ---\n{tail}"
            )
        if exc.exited:
            return EmbeddedTritonError(
                f"tritonserver exited early (rc {code})\n--- server log tail ---\n{tail}"
            )
        return EmbeddedTritonError(
            f"tritonserver not ready after {self.startup_timeout:.0f} s\n"
            f"--- server log tail ---\n{tail}"
        )

    def is_ready(self) -> bool:
        """True when the server answers ready on HTTP (all its loaded models ready)."""
        return answers_ok(self.ready_url)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout``, remove its /dev/shm
        regions; return its exit code."""
        code = self._server.stop(timeout) if self._server is not None else None
        for leftover in SHM_DIR.glob(self.shm_prefix + "*"):
            leftover.unlink(missing_ok=True)
        return code

    def shm_regions(self) -> list[Path]:
        """The server's Python-backend regions in /dev/shm right now."""
        return sorted(SHM_DIR.glob(self.shm_prefix + "*"))

    def kill(self) -> None:
        """SIGKILL the server's process group at once (for failure tests)."""
        if self._server is not None:
            self._server.kill()

    def __enter__(self) -> EmbeddedTriton:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
