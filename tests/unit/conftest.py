"""The unit layer: the real app and service in front of a fake Triton client, in this event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.auth import new_key
from gateway.settings import Settings
from tests.unit.fake_triton import FakeTriton


@dataclass
class UnitGateway:
    """An app under test, its fake Triton and the keys it accepts."""

    client: httpx.AsyncClient
    triton: FakeTriton
    settings: Settings
    infer_key: str
    admin_only_key: str

    @property
    def auth(self) -> dict[str, str]:
        """Headers carrying the infer key."""
        return {"X-API-Key": self.infer_key}

    async def wait_readyz(self, status: int, timeout_s: float = 5.0) -> httpx.Response:
        """Poll ``/readyz`` until it answers ``status``."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            response = await self.client.get("/readyz")
            if response.status_code == status:
                return response
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"/readyz still {response.status_code}: {response.text}")
            await asyncio.sleep(0.01)


@asynccontextmanager
async def unit_gateway(
    triton: FakeTriton | None = None, wait_ready: bool = True, **overrides: Any
) -> AsyncIterator[UnitGateway]:
    """The gateway app with its lifespan running, in front of ``triton`` (a fake)."""
    triton = triton or FakeTriton()
    infer_key, infer_entry = new_key(("infer",))
    admin_key, admin_entry = new_key(("admin",))
    options: dict[str, Any] = {
        "api_keys": [infer_entry, admin_entry],
        "health_interval_s": 0.02,
        "max_texts_per_request": 64,
        "max_text_chars": 100,
        "max_body_bytes": 4096,
        **overrides,
    }
    settings = Settings(_env_file=None, **options)
    app = create_app(settings, client=triton)
    async with app.router.lifespan_context(app):
        # Starlette re-raises after answering 500 (for the server to log); the answer is what counts.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            gateway = UnitGateway(client, triton, settings, infer_key, admin_key)
            if wait_ready:
                await gateway.wait_readyz(200)
            yield gateway


@pytest.fixture
async def gateway() -> AsyncIterator[UnitGateway]:
    """A ready gateway in front of a healthy fake Triton (batch limit 8)."""
    async with unit_gateway() as running:
        yield running
