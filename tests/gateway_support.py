"""A real gateway (uvicorn in a thread) for tests, with keys of every kind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from devtools.ports import free_port
from gateway.app import create_app
from gateway.auth import new_key
from gateway.settings import Settings


@dataclass
class RunningGateway:
    """A gateway serving on 127.0.0.1 and the keys it accepts."""

    base_url: str
    infer_key: str
    admin_only_key: str
    settings: Settings
    server: uvicorn.Server

    def client(
        self, key: str | None = "infer", headers: dict[str, str] | None = None, **kwargs: Any
    ) -> httpx.Client:
        """An HTTP client authenticated with ``key``: "infer" (the default), "admin", any other
        key as given, or None for no key."""
        keys = {"infer": self.infer_key, "admin": self.admin_only_key}
        merged = {"X-API-Key": keys[key]} if key in keys else {}
        if key is not None and key not in keys:
            merged = {"X-API-Key": key}
        merged.update(headers or {})
        return httpx.Client(
            **{"base_url": self.base_url, "headers": merged, "timeout": 30, **kwargs}
        )

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of the gateway's /metrics (0 when absent)."""
        with self.client(key=None) as client:
            text = client.get("/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return 0.0

    def wait_ready(self, timeout: float = 60) -> None:
        """Block until /readyz says 200."""
        deadline = time.monotonic() + timeout
        reason = "no answer"
        with httpx.Client(base_url=self.base_url) as client:
            while time.monotonic() < deadline:
                response = client.get("/readyz")
                if response.status_code == 200:
                    return
                reason = response.text
                time.sleep(0.1)
        raise TimeoutError(f"gateway not ready: {reason}")


@contextmanager
def running_gateway(
    triton_grpc_url: str,
    wait_ready: bool = True,
    extra_key_entries: tuple[str, ...] = (),
    **overrides: Any,
) -> Iterator[RunningGateway]:
    """Start a gateway in front of ``triton_grpc_url`` with ``overrides`` applied to its settings
    (and ``extra_key_entries`` accepted besides its own infer and admin keys)."""
    infer_key, infer_entry = new_key(("infer",))
    admin_key, admin_entry = new_key(("admin",))
    port = free_port()
    settings = Settings(
        _env_file=None,
        triton_grpc_url=triton_grpc_url,
        port=port,
        api_keys=[infer_entry, admin_entry, *extra_key_entries],
        health_interval_s=0.2,
        **{
            # These tests send bursts to check other things (pools, splitting, cancellation) on a
            # shared 2-core machine: admission may queue them for as long as their deadline, and
            # only tests about overload set a tighter queue budget.
            "admission_max_wait_s": 30.0,
            **overrides,
        },
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=port, log_config=None, access_log=False
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    gateway = RunningGateway(f"http://127.0.0.1:{port}", infer_key, admin_key, settings, server)
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        if wait_ready:
            gateway.wait_ready()
        yield gateway
    finally:
        server.should_exit = True
        thread.join(timeout=30)
