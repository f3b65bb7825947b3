"""The servers the load tool starts itself: an embedded Triton and a gateway process in front of it.

``compare``/``run`` measure them; ``overload`` and ``chaos`` start the same stack. The gateway is a
real ``python -m gateway serve`` child process configured through ``GATEWAY_*`` variables: the
tool sets only what it must (port, key, Triton's URL, log level, and what the caller passes in
``settings``); any other ``GATEWAY_*`` variable of the caller's environment passes through.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools.ports import free_port
from devtools.process import ManagedServer, child_environment
from devtools.triton import EmbeddedTriton


def embedded_triton(repository: Path, workdir: Path) -> EmbeddedTriton:
    """An embedded Triton (not started) serving the CPU profile rendered from ``repository``."""
    from build_models.profiles import render_repository

    cpu_repository = render_repository(workdir / "cpu-repository", "cpu", repository.resolve())
    return EmbeddedTriton(cpu_repository, workdir / "triton")


@dataclass
class GatewayProcess:
    """A gateway child process (not started), where it listens and the key it accepts."""

    server: ManagedServer
    base_url: str
    api_key: str

    @property
    def pid(self) -> int | None:
        """The gateway's process id, once started."""
        return self.server.process.pid if self.server.process is not None else None


def gateway_process(
    triton_url: str,
    workdir: Path,
    settings: Mapping[str, str] | None = None,
    max_texts_per_request: int = 512,
    extra_key_entries: Sequence[str] = (),
) -> GatewayProcess:
    """``python -m gateway serve`` in front of ``triton_url``, healthy once ``/readyz`` is 200.

    ``settings`` are extra ``GATEWAY_*`` variables (e.g. ``GATEWAY_REQUEST_TIMEOUT_S``);
    ``extra_key_entries`` more keys it accepts (through a keys file: a thousand would not fit
    in one environment variable).
    """
    from gateway.auth import new_key

    api_key, entry = new_key(("infer",))
    extra: dict[str, str] = {}
    if extra_key_entries:
        keys_file = workdir / "api-keys.txt"
        keys_file.parent.mkdir(parents=True, exist_ok=True)
        keys_file.write_text("\n".join(extra_key_entries) + "\n")
        extra["GATEWAY_API_KEYS_FILE"] = str(keys_file)
    port = free_port()
    env = child_environment(
        {
            "GATEWAY_TRITON_GRPC_URL": triton_url,
            "GATEWAY_PORT": str(port),
            "GATEWAY_API_KEYS": entry,
            "GATEWAY_LOG_LEVEL": "warning",
            "GATEWAY_MAX_TEXTS_PER_REQUEST": str(max(512, max_texts_per_request)),
            **extra,
            **(settings or {}),
        }
    )
    base_url = f"http://127.0.0.1:{port}"
    server = ManagedServer(
        [sys.executable, "-m", "gateway", "serve"],
        f"{base_url}/readyz",
        workdir / "gateway.log",
        env,
    )
    return GatewayProcess(server, base_url, api_key)
