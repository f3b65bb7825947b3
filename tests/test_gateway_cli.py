"""``python -m gateway dev`` (what `make run` serves) and the small CLI commands."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from devtools.ports import free_port
from devtools.process import processes_running
from gateway.auth import hash_key
from tests.conftest import ROOT, wait_for


def test_dev_serves_restarts_a_crashed_triton_and_stops_both_on_ctrl_c(
    built_repository: Path, tmp_path: Path
) -> None:
    port = free_port()
    log_path = tmp_path / "dev.log"
    work = tmp_path / "work"
    with log_path.open("wb") as log:
        dev = subprocess.Popen(
            [sys.executable, "-m", "gateway", "dev", "--repository", str(built_repository),
             "--workdir", str(work)],
            cwd=ROOT,
            env={**os.environ, "GATEWAY_PORT": str(port), "GATEWAY_LOG_LEVEL": "info"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        key = triton_http = None
        while time.monotonic() < deadline and dev.poll() is None:
            text = log_path.read_text(errors="replace")
            key_match = re.search(r"API key\s+(\S+)", text)
            http_match = re.search(r"HTTP (127\.0\.0\.1:\d+)", text)
            if key_match and http_match:
                key, triton_http = key_match.group(1), http_match.group(1)
                break
            time.sleep(0.2)
        assert key and triton_http, log_path.read_text()
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            answer = client.post(
                "/v1/predict",
                json={"texts": ["Great blender."]},
                headers={"Authorization": f"Bearer {key}"},
            )
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["scores"]) == 1
        # The access line is written after the response is sent: wait for it, then read the log.
        wait_for(
            lambda: '"path":"/v1/predict"' in log_path.read_text(),
            10,
            "the access log line of the request",
        )
        # The banner shows the development key on purpose; the JSON logs (access log included) never.
        json_lines = [line for line in log_path.read_text().splitlines() if line.startswith("{")]
        assert any('"path":"/v1/predict"' in line for line in json_lines)
        assert not any(key in line for line in json_lines)

        # Triton crashes: the supervisor restarts it on the same ports, and the gateway's
        # readiness drops, then comes back by itself once it has warmed up again.
        crashed = tritonserver(work)
        prefix = re.search(rb"shm-region-prefix-name=([^\x00]+)", crashed[1])
        assert prefix, crashed[1]
        os.kill(crashed[0], signal.SIGKILL)
        with httpx.Client(base_url=base, timeout=30) as client:
            wait_for(lambda: client.get("/readyz").status_code == 503, 5, "readiness to drop")
            wait_for(lambda: client.get("/readyz").status_code == 200, 90, "readiness to return")
            again = client.post(
                "/v1/predict",
                json={"texts": ["Great blender."]},
                headers={"Authorization": f"Bearer {key}"},
            )
        assert again.status_code == 200, again.text
        assert tritonserver(work)[0] != crashed[0]
        assert httpx.get(f"http://{triton_http}/v2/health/ready", timeout=5).status_code == 200
    finally:
        dev.send_signal(signal.SIGINT)
        code = dev.wait(timeout=60)
    assert code == 0
    try:
        httpx.get(f"http://{triton_http}/v2/health/live", timeout=2)
        raise AssertionError("Triton still answers after the dev command stopped")
    except httpx.TransportError:
        pass
    # Nothing of either server is left: no stub of the crashed one, no shared-memory region.
    assert not processes_running(work)
    assert not list(Path("/dev/shm").glob(prefix.group(1).decode() + "*"))


def tritonserver(work: Path) -> tuple[int, bytes]:
    """The pid and command line of the tritonserver that ``dev`` runs from ``work``."""
    for pid in processes_running(work):
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"bin/tritonserver" in command.split(b"\x00")[0]:
            return pid, command
    raise AssertionError(f"no tritonserver runs from {work}")


def test_new_key_prints_a_key_and_its_digest_entry() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "new-key", "--scopes", "infer+admin"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    key = re.search(r"key:\s+(\S+)", result.stdout)
    entry = re.search(r"entry:\s+(\S+)", result.stdout)
    assert key and entry
    assert entry.group(1) == f"{hash_key(key.group(1))}:infer+admin"
