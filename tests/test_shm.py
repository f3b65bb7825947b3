"""Shared-memory transport against a real Triton: results, pool limits, fallbacks, cleanup,
Triton restarts, stale regions of a crashed gateway, and cancellation safety."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import pytest
import tritonclient.grpc as grpcsync
from prometheus_client import CollectorRegistry

from devtools.triton import EmbeddedTriton
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.triton.client import TritonClient
from gateway.triton.shm import (
    SHM_DIR,
    SharedMemoryManager,
    ShmUnavailable,
    is_loopback_url,
    load_cupy,
    unregister_by_name,
)
from gateway.triton.shm.rpc import SharedMemoryRpc
from tests.conftest import TEXTS, wait_for
from tests.gateway_support import RunningGateway, running_gateway


def registered(url: str) -> set[str]:
    """Names of the system shared-memory regions Triton has registered."""
    with grpcsync.InferenceServerClient(url) as client:
        return set(client.get_system_shared_memory_status().regions.keys())


def ours(names: set[str] | list[str], prefix: str) -> set[str]:
    return {name for name in names if name.startswith(prefix + "-")}


def shm_files(prefix: str) -> set[str]:
    return {path.name for path in SHM_DIR.glob(prefix + "-*")}


def unique_prefix() -> str:
    return f"test-{secrets.token_hex(3)}"


def post(gateway: RunningGateway, route: str, texts: list[str]) -> dict[str, Any]:
    with gateway.client() as client:
        response = client.post(route, json={"texts": texts})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def readyz_status(gateway: RunningGateway) -> int:
    with gateway.client(key=None) as client:
        return client.get("/readyz").status_code


@pytest.fixture(scope="module")
def shm_gateway(triton: EmbeddedTriton) -> object:
    """A system_shm gateway with a pool of 2 that waits long enough for a region to come free.

    Admission control is off: these tests need more requests in flight than regions, and
    admission would let only its in-flight limit (8 texts at first) reach the pool."""
    prefix = unique_prefix()
    with running_gateway(
        triton.grpc_url,
        transport="system_shm",
        shm_pool_size=2,
        shm_acquire_timeout_s=20,
        admission_enabled=False,
        shm_prefix=prefix,
    ) as running:
        yield running
    # After shutdown nothing of ours stays registered in Triton or in /dev/shm.
    assert not ours(registered(triton.grpc_url), prefix)
    assert not shm_files(prefix)


# --- results and pool --------------------------------------------------------------------------


def test_system_shm_results_equal_grpc(
    gateway: RunningGateway, shm_gateway: RunningGateway
) -> None:
    for route, key in (("/v1/predict", "scores"), ("/v1/embed", "embeddings")):
        over_grpc = post(gateway, route, TEXTS)
        over_shm = post(shm_gateway, route, TEXTS)
        np.testing.assert_allclose(np.array(over_shm[key]), np.array(over_grpc[key]), atol=1e-6)
    assert (
        shm_gateway.metric(
            "gateway_triton_request_duration_seconds_count",
            model="text_embedding_v1",
            transport="system_shm",
        )
        >= 1
    )
    prefix = shm_gateway.settings.shm_prefix
    assert len(ours(registered(shm_gateway.settings.triton_grpc_url), prefix)) == 2
    assert len(shm_files(prefix)) == 3  # two regions and the process lock


def test_more_concurrent_requests_than_regions_all_succeed(shm_gateway: RunningGateway) -> None:
    texts = [[f"review {i}: {TEXTS[i % 4]}"] * (1 + i % 5) for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        bodies = list(pool.map(lambda t: post(shm_gateway, "/v1/embed", t), texts))
    for body, sent in zip(bodies, texts, strict=True):
        assert np.array(body["embeddings"]).shape == (len(sent), 384)
    assert shm_gateway.metric("gateway_shm_region_waits_total", transport="system_shm") >= 1
    assert shm_gateway.metric("gateway_shm_fallbacks_total", transport="system_shm") == 0
    assert shm_gateway.metric("gateway_shm_regions_in_use", transport="system_shm") == 0


def test_payload_too_large_for_a_region_falls_back_to_grpc(
    triton: EmbeddedTriton, gateway: RunningGateway
) -> None:
    # 4096-byte regions: 8 embeddings (8*384*4 bytes) cannot fit, the warm-up's 2 can.
    texts = TEXTS * 2
    with running_gateway(
        triton.grpc_url, transport="system_shm", shm_region_bytes=4096, shm_prefix=unique_prefix()
    ) as small:
        body = post(small, "/v1/embed", texts)
        fallbacks = small.metric(
            "gateway_shm_fallbacks_total", transport="system_shm", reason="too_large"
        )
        on_grpc = small.metric(
            "gateway_triton_request_duration_seconds_count",
            model="text_embedding_v1",
            transport="grpc",
        )
    assert fallbacks == 1 and on_grpc == 1
    expected = post(gateway, "/v1/embed", texts)
    np.testing.assert_allclose(
        np.array(body["embeddings"]), np.array(expected["embeddings"]), atol=1e-6
    )


# --- lifecycle ----------------------------------------------------------------------------------


def test_regions_are_registered_again_after_triton_restarts(own_triton: EmbeddedTriton) -> None:
    prefix = unique_prefix()
    url = own_triton.grpc_url
    with running_gateway(url, transport="system_shm", shm_pool_size=2, shm_prefix=prefix) as gw:
        before = post(gw, "/v1/predict", TEXTS)
        assert len(ours(registered(url), prefix)) == 2
        own_triton.stop()
        wait_for(lambda: readyz_status(gw) == 503, 30, "readiness to drop")
        own_triton.start()
        assert own_triton.grpc_url == url
        gw.wait_ready()
        # Readiness returned only after the connect hook registered the regions again.
        assert len(ours(registered(url), prefix)) == 2
        after = post(gw, "/v1/predict", TEXTS)
        np.testing.assert_allclose(after["scores"], before["scores"], atol=1e-6)
        assert (
            gw.metric(
                "gateway_triton_request_duration_seconds_count",
                model="text_regression_v1",
                transport="system_shm",
            )
            == 2
        )
    assert not ours(registered(url), prefix)
    assert not shm_files(prefix)


def dead_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True, text=True)  # fmt: skip
    return int(child.stdout)


def test_stale_regions_of_a_crashed_gateway_are_cleaned_but_live_ones_kept(
    triton: EmbeddedTriton,
) -> None:
    prefix = unique_prefix()
    url = triton.grpc_url
    crashed = f"{prefix}-crashedhost-{dead_pid()}-deadbeef"
    stale = f"{crashed}_1"
    path = SHM_DIR / stale
    path.write_bytes(b"\0" * 4096)
    (SHM_DIR / f"{crashed}_lock").touch()  # its lock file, no longer locked by anyone
    foreign = f"other-{secrets.token_hex(3)}"  # another deployment's region: never touched
    (SHM_DIR / foreign).write_bytes(b"\0" * 4096)
    try:
        with grpcsync.InferenceServerClient(url) as client:
            client.register_system_shared_memory(stale, "/" + stale, 4096)
            client.register_system_shared_memory(foreign, "/" + foreign, 4096)
        with running_gateway(url, transport="system_shm", shm_pool_size=1, shm_prefix=prefix) as a:
            names = registered(url)
            assert stale not in names and foreign in names
            assert not path.exists() and not (SHM_DIR / f"{crashed}_lock").exists()
            first = ours(names, prefix)
            assert len(first) == 1
            # A second live gateway (another worker) of the same deployment keeps a's regions.
            with running_gateway(url, transport="system_shm", shm_pool_size=1, shm_prefix=prefix):
                assert first < ours(registered(url), prefix)
                post(a, "/v1/predict", TEXTS)
    finally:
        with grpcsync.InferenceServerClient(url) as client:
            for name in (stale, foreign):
                if name in registered(url):
                    client.unregister_system_shared_memory(name)
        path.unlink(missing_ok=True)
        (SHM_DIR / foreign).unlink(missing_ok=True)
    assert not ours(registered(url), prefix) and not shm_files(prefix)


# --- cancellation -------------------------------------------------------------------------------


async def test_cancelled_request_never_returns_its_region_to_the_pool(
    triton: EmbeddedTriton,
) -> None:
    prefix = unique_prefix()
    settings = Settings(
        _env_file=None,
        triton_grpc_url=triton.grpc_url,
        transport="system_shm",
        shm_pool_size=1,
        shm_acquire_timeout_s=0,
        shm_prefix=prefix,
    )
    metrics = GatewayMetrics(CollectorRegistry())
    client = TritonClient(settings, metrics)
    over_grpc = TritonClient(settings.model_copy(update={"transport": "grpc"}), metrics)
    manager = client.shm
    assert manager is not None
    try:
        await client.connect()
        model = await client.model_info("text_embedding_v1", 10)
        pool = manager.pool
        assert pool is not None
        (slot,) = pool.live
        # About a second of encoder work on a 2-core CPU: long enough to cancel mid-call.
        texts = [f"a long enough review, number {i}, of a kettle. " * 10 for i in range(64)]
        call = asyncio.ensure_future(client.infer_texts(model, texts, "embedding"))
        await asyncio.sleep(0.05)
        assert not call.done()
        # While the call holds the only slot, no other request gets it (it would go over gRPC).
        assert await manager.acquire(100, 100) is None
        assert metrics.shm_fallbacks.labels("system_shm", "pool_exhausted")._value.get() == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # The slot Triton may still write into is retired, never handed out again...
        assert slot not in pool.live
        await asyncio.wait_for(pool.wait_idle(), 60)
        # ...a fresh slot with a new name replaced it and the old name left Triton.
        (fresh,) = pool.live
        assert fresh.names != slot.names and not pool.retired
        names = await asyncio.to_thread(registered, triton.grpc_url)
        assert ours(names, prefix) == set(fresh.names)
        assert metrics.shm_regions_in_use.labels("system_shm")._value.get() == 0
        other = await over_grpc.infer_texts(model, TEXTS, "embedding")
        again = await client.infer_texts(model, TEXTS, "embedding")
        assert again.transport == "system_shm"
        np.testing.assert_allclose(again.array, other.array, atol=1e-6)
    finally:
        await client.close()
        await over_grpc.close()
    assert not ours(await asyncio.to_thread(registered, triton.grpc_url), prefix)
    assert not shm_files(prefix)


# --- units --------------------------------------------------------------------------------------


async def test_unregister_without_a_name_is_refused() -> None:
    with pytest.raises(ValueError, match="without a region name"):
        await unregister_by_name(cast(SharedMemoryRpc, object()), "system_shm", "")


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("127.0.0.1:8001", True),
        ("localhost:8001", True),
        ("[::1]:8001", True),
        ("triton:8001", False),
        ("10.0.0.5:8001", False),
    ],
)
def test_loopback_urls(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_auto_off_host_uses_grpc() -> None:
    settings = Settings(_env_file=None, transport="auto", triton_grpc_url="triton:8001")
    never_called = cast(SharedMemoryRpc, object())
    metrics = GatewayMetrics(CollectorRegistry())
    assert SharedMemoryManager.from_settings(never_called, settings, metrics) is None


def gpu_available() -> bool:
    """CuPy imports and sees a GPU (the import the gateway itself does, warnings and all)."""
    try:
        load_cupy()
    except ShmUnavailable:
        return False
    return True


@pytest.mark.skipif(gpu_available(), reason="CuPy and a GPU are present")
def test_cuda_transport_without_cupy_or_a_gpu_fails_clearly() -> None:
    with pytest.raises(ShmUnavailable, match="cuda_shm"):
        load_cupy()


# --- GPU (tests/gpu/run_gpu_checks.sh) ----------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU and CuPy")
def test_cuda_shm_results_equal_grpc(triton: EmbeddedTriton, gateway: RunningGateway) -> None:
    prefix = unique_prefix()
    with running_gateway(
        triton.grpc_url, transport="cuda_shm", shm_prefix=prefix, cuda_device_id=0
    ) as cuda:
        for route, key in (("/v1/predict", "scores"), ("/v1/embed", "embeddings")):
            over_grpc = post(gateway, route, TEXTS)
            over_cuda = post(cuda, route, TEXTS)
            np.testing.assert_allclose(
                np.array(over_cuda[key]), np.array(over_grpc[key]), atol=1e-5
            )
        assert (
            cuda.metric(
                "gateway_triton_request_duration_seconds_count",
                model="text_embedding_v1",
                transport="cuda_shm",
            )
            >= 1
        )
    with grpcsync.InferenceServerClient(triton.grpc_url) as client:
        names = set(client.get_cuda_shared_memory_status().regions.keys())
    assert not ours(names, prefix)
