"""The shared-memory pool and manager without a Triton server.

``FakeTriton`` keeps Triton's shared-memory registry in a dict and can wipe it (a Triton restart),
refuse calls (``InferenceServerException``), hold a call until the test opens a gate (a slow RPC)
and yield to the event loop inside every call, as a real RPC does. Slots are real ``SystemSlot``s
in ``/dev/shm`` under a prefix of the test's own, which must be gone when the test ends.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import inspect
import os
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from gateway import errors
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.triton.shm import (
    CUDA_SHM,
    SHM_DIR,
    SYSTEM_SHM,
    Lease,
    RegionPool,
    SharedMemoryManager,
    SharedMemoryRpc,
    ShmUnavailable,
    Slot,
    SystemSlot,
    unregister_by_name,
)
from gateway.triton.shm import manager as manager_module
from gateway.triton.shm import pool as pool_module
from tests.unit.fake_cupy import FakeRuntime, fake_cupy

REGION_BYTES = 4096
# Only a broken pool ever waits this long for an event the test awaits.
FAIL_AFTER_S = 10.0
T = TypeVar("T")

# --- the fake Triton ----------------------------------------------------------------------------


@dataclass
class Gate:
    """Holds every call of one RPC until ``opened`` is set; ``entered`` says one is waiting."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Status:
    """A shared-memory status response."""

    regions: dict[str, object]


class FakeTriton:
    """An in-memory ``SharedMemoryRpc`` with Triton's registry semantics (system and CUDA)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.system: dict[str, str] = {}
        self.cuda: dict[str, int] = {}
        # The 64-byte cudaIpcMemHandle_t of each CUDA region, as Triton receives it.
        self.cuda_handles: dict[str, bytes] = {}
        # Every name ever passed to an unregister call, in order ("" would mean "all of them").
        self.unregistered: list[str] = []
        self.refusing: set[str] = set()  # RPC method names that fail
        self.busy: dict[str, int] = {}  # region name -> unregister calls still to refuse
        self.gates: dict[str, Gate] = {}
        self.rng = rng

    def gate(self, method: str) -> Gate:
        """Hold every call of ``method`` from now until the returned gate opens."""
        self.gates[method] = Gate()
        return self.gates[method]

    def open_gates(self) -> None:
        """Let every held call go on (teardown after a failure must not wait at a gate)."""
        for gate in self.gates.values():
            gate.opened.set()

    def restart(self) -> None:
        """Triton restarted: nothing is registered any more."""
        self.system.clear()
        self.cuda.clear()
        self.cuda_handles.clear()

    async def _call(self, method: str) -> None:
        gate = self.gates.get(method)
        if gate is not None:
            gate.entered.set()
            await gate.opened.wait()
        # A real RPC gives the event loop to others while it is on the wire.
        for _ in range(self.rng.randint(1, 4) if self.rng else 1):
            await asyncio.sleep(0)
        if method in self.refusing:
            raise InferenceServerException(f"{method} refused by the fake")

    async def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, *, client_timeout: float | None = None
    ) -> None:
        await self._call("register_system_shared_memory")
        if name in self.system:
            raise InferenceServerException(f"shared memory region '{name}' already in manager")
        if not (SHM_DIR / key.removeprefix("/")).exists():
            raise InferenceServerException(f"Unable to open shared memory region: '{key}'")
        self.system[name] = key

    async def unregister_system_shared_memory(
        self, name: str = "", *, client_timeout: float | None = None
    ) -> None:
        await self._call("unregister_system_shared_memory")
        self.unregistered.append(name)
        if self.busy.get(name, 0) > 0:
            self.busy[name] -= 1
            raise InferenceServerException(f"Cannot unregister '{name}': it is in use")
        if not name:
            self.system.clear()
        self.system.pop(name, None)  # an unknown name is not an error in Triton

    async def get_system_shared_memory_status(
        self, *, client_timeout: float | None = None
    ) -> Status:
        await self._call("get_system_shared_memory_status")
        return Status(dict(self.system))

    async def register_cuda_shared_memory(
        self,
        name: str,
        raw_handle: bytes,
        device_id: int,
        byte_size: int,
        *,
        client_timeout: float | None = None,
    ) -> None:
        await self._call("register_cuda_shared_memory")
        if name in self.cuda:
            raise InferenceServerException(f"shared memory region '{name}' already in manager")
        # The client sends base64.b64decode(raw_handle); Triton opens exactly those 64 bytes.
        handle = base64.b64decode(raw_handle, validate=True)
        if len(handle) != 64:
            raise InferenceServerException(f"invalid CUDA IPC handle of {len(handle)} bytes")
        self.cuda[name] = device_id
        self.cuda_handles[name] = handle

    async def unregister_cuda_shared_memory(
        self, name: str = "", *, client_timeout: float | None = None
    ) -> None:
        await self._call("unregister_cuda_shared_memory")
        self.unregistered.append(name)
        if not name:
            self.cuda.clear()
            self.cuda_handles.clear()
        self.cuda.pop(name, None)
        self.cuda_handles.pop(name, None)

    async def get_cuda_shared_memory_status(self, *, client_timeout: float | None = None) -> Status:
        await self._call("get_cuda_shared_memory_status")
        return Status(dict(self.cuda))


# --- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture
def prefix() -> Iterator[str]:
    """A /dev/shm prefix of this test's own; nothing under it may outlive the test."""
    prefix = f"unit-{secrets.token_hex(4)}"
    yield prefix
    leftovers = sorted(path.name for path in SHM_DIR.glob(prefix + "*"))
    for name in leftovers:
        (SHM_DIR / name).unlink(missing_ok=True)
    assert not leftovers, f"left in /dev/shm: {leftovers}"


@pytest.fixture
def fake() -> FakeTriton:
    return FakeTriton()


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retry a refused unregister at once (the backoff is not what these tests are about)."""
    monkeypatch.setattr(pool_module, "RETRY_FIRST_DELAY_S", 0.0)
    monkeypatch.setattr(pool_module, "RETRY_MAX_DELAY_S", 0.0)


PoolMaker = Callable[..., RegionPool]


@pytest.fixture
async def make_pool(prefix: str, fake: FakeTriton) -> AsyncIterator[PoolMaker]:
    """Pools of SystemSlots named under ``prefix``, all closed when the test ends."""
    pools: list[RegionPool] = []

    def make(
        size: int = 2, acquire_timeout_s: float = 0.0, client: SharedMemoryRpc | None = None
    ) -> RegionPool:
        pool = RegionPool(
            client if client is not None else fake,
            SystemSlot,
            f"{prefix}-pool",
            size,
            REGION_BYTES,
            acquire_timeout_s,
            GatewayMetrics(CollectorRegistry()),
        )
        pools.append(pool)
        return pool

    yield make
    fake.open_gates()
    for pool in pools:
        await pool.close()


def settings_for(prefix: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "transport": "system_shm",
        "shm_prefix": prefix,
        "shm_pool_size": 2,
        "shm_region_bytes": REGION_BYTES,
        "shm_acquire_timeout_s": 0,
        "shm_auto_min_bytes": 0,
        **overrides,
    }
    return Settings(_env_file=None, **values)


@pytest.fixture
async def make_manager(
    fake: FakeTriton, prefix: str
) -> AsyncIterator[Callable[..., SharedMemoryManager]]:
    """Managers over the fake under ``prefix``, all closed when the test ends."""
    managers: list[SharedMemoryManager] = []

    def make(**overrides: Any) -> SharedMemoryManager:
        manager = SharedMemoryManager.from_settings(
            fake, settings_for(prefix, **overrides), GatewayMetrics(CollectorRegistry())
        )
        assert manager is not None
        managers.append(manager)
        return manager

    yield make
    fake.open_gates()
    for manager in managers:
        await manager.close()


async def within(awaitable: Awaitable[T]) -> T:
    """Await an event the test counts on; a bug that never sets it fails the test, not hangs it."""
    return await asyncio.wait_for(awaitable, FAIL_AFTER_S)


def registered(fake: FakeTriton, slot: Slot) -> bool:
    return all(name in fake.system for name in slot.names)


def in_use(pool: RegionPool) -> float:
    value: float = pool.metrics.shm_regions_in_use.labels(SYSTEM_SHM)._value.get()
    return value


async def lease_all(pool: RegionPool) -> list[Lease]:
    """Every slot the pool hands out right now (call with ``acquire_timeout_s`` 0)."""
    assert pool.acquire_timeout_s == 0
    leases = []
    while (lease := await pool.acquire(8, 8)) is not None:
        leases.append(lease)
    return leases


# --- the protocol -------------------------------------------------------------------------------


def test_the_aio_client_satisfies_the_rpc_protocol() -> None:
    methods = [name for name in vars(SharedMemoryRpc) if "shared_memory" in name]
    assert len(methods) == 6
    empty = inspect.Parameter.empty
    for name in methods:
        ours = inspect.signature(getattr(SharedMemoryRpc, name)).parameters
        real_function = getattr(InferenceServerClient, name)
        assert inspect.iscoroutinefunction(real_function), name
        real = inspect.signature(real_function).parameters
        positions = list(real)
        for index, (param_name, param) in enumerate(ours.items()):
            other = real.get(param_name)
            assert other is not None, (name, param_name)
            assert other.kind in (other.POSITIONAL_OR_KEYWORD, other.KEYWORD_ONLY), name
            if param.kind is param.POSITIONAL_OR_KEYWORD:
                assert positions[index] == param_name, (name, param_name)
            if param.default is not empty:
                assert other.default == param.default, (name, param_name)
        required = {p for p, v in real.items() if v.default is empty}
        assert required <= set(ours), (name, required)


async def test_unregister_without_a_name_is_refused(fake: FakeTriton) -> None:
    with pytest.raises(ValueError, match="without a region name"):
        await unregister_by_name(fake, SYSTEM_SHM, "")
    assert fake.unregistered == []


# --- leasing ------------------------------------------------------------------------------------


async def test_acquire_write_read_release(make_pool: PoolMaker, fake: FakeTriton) -> None:
    pool = make_pool(size=2)
    await pool.reconcile()
    assert len(pool.live) == 2 and all(registered(fake, slot) for slot in pool.live)
    assert set(fake.system) == {name for slot in pool.live for name in slot.names}

    lease = await pool.acquire(5, 12)
    assert lease is not None and lease.transport == SYSTEM_SHM
    assert (lease.input.offset, lease.input.byte_size) == (0, 5)
    assert (lease.output.offset, lease.output.byte_size) == (64, 12)  # cache-line aligned
    lease.slot.write(lease.input, b"hello")
    expected = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    lease.slot.write(lease.output, expected.tobytes())  # as Triton would
    np.testing.assert_array_equal(lease.slot.read_float32(lease.output, [3]), expected)
    assert in_use(pool) == 1

    pool.release(lease, finished=True)
    assert in_use(pool) == 0
    again = await lease_all(pool)
    assert lease.slot in {other.slot for other in again} and len(again) == 2
    assert pool.fits(REGION_BYTES - 64, 64) and not pool.fits(REGION_BYTES - 63, 64)


async def test_exhausted_pool_waits_for_a_release_and_gives_up_after_its_timeout(
    make_pool: PoolMaker,
) -> None:
    pool = make_pool(size=1, acquire_timeout_s=30)
    await pool.reconcile()
    held = await pool.acquire(8, 8)
    assert held is not None
    waiter = asyncio.ensure_future(pool.acquire(8, 8))
    await asyncio.sleep(0)
    assert not waiter.done()
    pool.release(held, finished=True)
    lease = await within(waiter)  # woken by the release, long before its 30 s
    assert lease is not None and lease.slot is held.slot
    assert pool.metrics.shm_waits.labels(SYSTEM_SHM)._value.get() == 1

    pool.acquire_timeout_s = 0.01  # bounded: nothing comes free, so None after the timeout
    assert await pool.acquire(8, 8) is None
    pool.acquire_timeout_s = 0
    assert await pool.acquire(8, 8) is None
    pool.release(lease, finished=True)


@pytest.mark.parametrize("seed", range(4))
async def test_concurrent_leases_race_with_reconciles(
    make_pool: PoolMaker, prefix: str, seed: int, fast_retries: None
) -> None:
    rng = random.Random(seed)
    fake = FakeTriton(rng)
    pool = make_pool(size=4, acquire_timeout_s=60, client=fake)
    await pool.reconcile()
    holders: set[Slot] = set()
    retired: set[Slot] = set()

    async def request() -> None:
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
        lease = await pool.acquire(8, 8)
        assert lease is not None
        slot = lease.slot
        # Leased only when live, registered, not retired and held by no one else.
        assert slot in pool.live and slot not in retired and slot not in holders
        assert registered(fake, slot), slot.names
        holders.add(slot)
        for _ in range(rng.randint(0, 5)):
            await asyncio.sleep(0)
        holders.discard(slot)
        finished = rng.random() < 0.7
        if not finished:
            retired.add(slot)
        pool.release(lease, finished)

    async def reconciles() -> None:
        for _ in range(10):
            await pool.reconcile()
            for _ in range(rng.randint(0, 5)):
                await asyncio.sleep(0)

    tasks = [request() for _ in range(50)] + [reconciles()]
    rng.shuffle(tasks)
    await within(asyncio.gather(*tasks))
    await within(pool.wait_idle())

    assert retired, "the race should retire some slots"
    assert len(pool.live) == 4 and not pool.retired and not set(pool.live) & retired
    assert set(fake.system) == {name for slot in pool.live for name in slot.names}
    retired_names = {name for slot in retired for name in slot.names}
    assert retired_names <= set(fake.unregistered) and "" not in fake.unregistered
    assert {path.name for path in SHM_DIR.glob(prefix + "*")} == set(fake.system)
    assert in_use(pool) == 0
    pool.acquire_timeout_s = 0
    assert len(await lease_all(pool)) == 4


# --- retiring -----------------------------------------------------------------------------------


async def test_a_retired_slot_is_unregistered_by_name_replaced_and_never_leased_again(
    make_pool: PoolMaker, fake: FakeTriton, fast_retries: None
) -> None:
    pool = make_pool(size=2)
    await pool.reconcile()
    lease = await pool.acquire(8, 8)
    assert lease is not None
    old = lease.slot
    (name,) = old.names
    fake.busy[name] = 3  # Triton still finishes the abandoned request: refuses three times

    pool.release(lease, finished=False)
    assert old not in pool.live and old in pool.retired
    (other,) = await lease_all(pool)  # the other slot, not the retired one
    assert other.slot is not old
    await within(pool.wait_idle())

    assert fake.unregistered == [name] * 4 and name not in fake.system
    assert not (SHM_DIR / name).exists()
    assert not pool.retired and len(pool.live) == 2 and old not in pool.live
    (fresh,) = [slot for slot in pool.live if slot is not other.slot]
    assert registered(fake, fresh) and name not in fresh.names
    (again,) = await lease_all(pool)
    assert again.slot is fresh


async def test_retiring_gives_up_after_its_attempts_and_the_close_tries_again(
    make_pool: PoolMaker, fake: FakeTriton, fast_retries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "RETIRE_ATTEMPTS", 3)
    pool = make_pool(size=1)
    await pool.reconcile()
    lease = await pool.acquire(8, 8)
    assert lease is not None
    (name,) = lease.slot.names
    fake.busy[name] = 3
    pool.release(lease, finished=False)
    await within(pool.wait_idle())
    assert fake.unregistered == [name] * 3 and pool.retired == (lease.slot,)
    # The replacement serves meanwhile.
    (fresh,) = pool.live
    assert registered(fake, fresh) and (await lease_all(pool))[0].slot is fresh
    await pool.close()
    assert sorted(fake.unregistered[3:]) == sorted([name, *fresh.names]) and not fake.system


async def test_a_release_during_a_reconcile_never_lets_an_unregistered_slot_be_leased(
    make_pool: PoolMaker, fake: FakeTriton, fast_retries: None
) -> None:
    pool = make_pool(size=3)
    await pool.reconcile()
    first, second, third = await lease_all(pool)
    gate = fake.gate("register_system_shared_memory")
    # Two retirements: the worker unregisters them, makes two new slots and, registering the
    # first of those, is held at the gate...
    pool.release(first, finished=False)
    pool.release(second, finished=False)
    await within(gate.entered.wait())
    # ...while the last original slot is retired too (the old loop then skipped a new slot).
    pool.release(third, finished=False)
    assert await pool.acquire(8, 8) is None  # nothing registered is free yet
    gate.opened.set()
    await within(pool.wait_idle())

    assert not pool.retired and len(pool.live) == 3
    leases = await lease_all(pool)
    assert len(leases) == 3
    for lease in leases:
        assert registered(fake, lease.slot)
        assert lease.slot not in (first.slot, second.slot, third.slot)
    for lease in leases:
        pool.release(lease, finished=True)


# --- Triton restarts ----------------------------------------------------------------------------


async def test_a_triton_restart_registers_every_live_slot_again(
    make_manager: Callable[..., SharedMemoryManager], fake: FakeTriton
) -> None:
    manager = make_manager(shm_pool_size=3)
    await manager.connect()
    pool = manager.pool
    assert pool is not None
    held = await manager.acquire(8, 8)
    assert held is not None
    fake.restart()
    gate = fake.gate("register_system_shared_memory")
    reconnect = asyncio.ensure_future(manager.connect())  # the readiness connect hook
    await within(gate.entered.wait())
    # Slots Triton lost are not handed out until registered again.
    assert await manager.acquire(8, 8) is None
    gate.opened.set()
    await within(reconnect)
    assert len(pool.live) == 3 and all(registered(fake, slot) for slot in pool.live)
    assert set(fake.system) == {name for slot in pool.live for name in slot.names}
    manager.release(held, finished=True)  # the held one was registered again too
    assert len(await lease_all(pool)) == 3


async def test_a_finished_release_while_triton_lost_the_slot_waits_for_registration(
    make_pool: PoolMaker, fake: FakeTriton
) -> None:
    pool = make_pool(size=1)
    await pool.reconcile()
    lease = await pool.acquire(8, 8)
    assert lease is not None
    fake.restart()
    gate = fake.gate("register_system_shared_memory")
    reconcile = asyncio.ensure_future(pool.reconcile())
    await within(gate.entered.wait())
    pool.release(lease, finished=True)
    assert await pool.acquire(8, 8) is None
    gate.opened.set()
    await within(reconcile)
    again = await pool.acquire(8, 8)
    assert again is not None and again.slot is lease.slot and registered(fake, again.slot)
    pool.release(again, finished=True)


# --- manager: close, stale cleanup, auto ---------------------------------------------------------


async def test_close_unregisters_exactly_our_regions_by_name_and_removes_our_files(
    make_manager: Callable[..., SharedMemoryManager],
    fake: FakeTriton,
    prefix: str,
    fast_retries: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "RETIRE_ATTEMPTS", 1)
    foreign = {"other-deployment_1": "/other-deployment_1", f"{prefix}x-sibling_1": "/x"}
    fake.system.update(foreign)
    manager = make_manager(shm_pool_size=3)
    await manager.connect()
    pool = manager.pool
    assert pool is not None
    lease = await manager.acquire(8, 8)
    assert lease is not None
    fake.busy[lease.slot.names[0]] = 1  # one retired slot is still waiting to leave Triton
    manager.release(lease, finished=False)
    await within(pool.wait_idle())
    ours = {name for slot in [*pool.live, *pool.retired] for name in slot.names}
    assert len(ours) == 4 and ours <= set(fake.system)
    assert len(list(SHM_DIR.glob(prefix + "-*"))) == 5  # four regions and the process lock
    fake.unregistered.clear()

    await manager.close()
    assert sorted(fake.unregistered) == sorted(ours)
    assert fake.system == foreign
    assert not list(SHM_DIR.glob(prefix + "-*"))


@pytest.fixture
def dead_and_live_runs(prefix: str, fake: FakeTriton) -> Iterator[tuple[list[str], list[str]]]:
    """Regions and files of a crashed run (free lock), of one without a lock file at all, and
    of a live sibling (this test holds its flock); yields (stale names, live names)."""
    crashed, lockless, sibling = (f"{prefix}-{host}-{n}-cafe" for n, host in enumerate("abc"))
    stale = [f"{crashed}_1", f"{crashed}_2", f"{lockless}_1"]
    live = [f"{sibling}_1"]
    for name in [*stale, *live]:
        (SHM_DIR / name).write_bytes(b"\0" * REGION_BYTES)
        fake.system[name] = "/" + name
    (SHM_DIR / f"{crashed}_lock").touch()
    fd = os.open(SHM_DIR / f"{sibling}_lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        yield stale, live
    finally:
        os.close(fd)
        for path in SHM_DIR.glob(f"{sibling}_*"):
            path.unlink()


async def test_stale_cleanup_removes_a_dead_run_and_keeps_a_live_one(
    make_manager: Callable[..., SharedMemoryManager],
    fake: FakeTriton,
    prefix: str,
    dead_and_live_runs: tuple[list[str], list[str]],
) -> None:
    stale, live = dead_and_live_runs
    fake.system["other-deployment_1"] = "/other-deployment_1"
    manager = make_manager()
    await manager.connect()
    assert sorted(fake.unregistered) == sorted(stale)
    assert not set(stale) & set(fake.system)
    assert {*live, "other-deployment_1"} <= set(fake.system)
    remaining = {path.name for path in SHM_DIR.glob(prefix + "-*")}
    assert not any(name.startswith(prefix + "-a-") for name in remaining)  # lock file too
    assert not any(name.startswith(prefix + "-b-") for name in remaining)
    assert {*live, f"{live[0].partition('_')[0]}_lock"} <= remaining
    # Only the first connection cleans; a reconnection leaves everything else alone.
    fake.unregistered.clear()
    await manager.connect()
    assert fake.unregistered == []


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto goes straight to system shm, whether or not this machine has CuPy and a GPU."""

    def load() -> None:
        raise ShmUnavailable("no cupy here")

    monkeypatch.setattr(manager_module, "load_cupy", load)


@pytest.fixture
def cuda_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    """A fake CuPy with two GPUs in place of the real one; every allocation freed at the end
    (ask for it before ``make_manager``, whose teardown closes the managers)."""
    runtime = FakeRuntime(device_count=2)
    monkeypatch.setattr(manager_module, "load_cupy", lambda: fake_cupy(runtime))
    yield runtime
    assert not runtime.memory, "CUDA memory left allocated"


async def test_cuda_shm_registers_ipc_handles_and_moves_the_bytes(
    cuda_runtime: FakeRuntime, make_manager: Callable[..., SharedMemoryManager], fake: FakeTriton
) -> None:
    manager = make_manager(transport="cuda_shm", cuda_device_id=1)
    await manager.connect()
    pool = manager.pool
    assert pool is not None and pool.transport == CUDA_SHM
    assert set(fake.cuda) == {slot.names[0] for slot in pool.live} and not fake.system
    assert set(fake.cuda.values()) == {1}
    # Triton got each region's own 64-byte handle; the memory lives on the configured GPU.
    devices = {
        FakeRuntime.handle_of(address): device
        for address, (device, _) in cuda_runtime.memory.items()
    }
    assert {devices[handle] for handle in fake.cuda_handles.values()} == {1}
    assert len(set(fake.cuda_handles.values())) == 2
    assert cuda_runtime.current == 0  # the caller's device is restored after each allocation

    lease = await manager.acquire(5, 12)
    assert lease is not None and lease.transport == CUDA_SHM
    lease.slot.write(lease.input, b"hello")
    expected = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    lease.slot.write(lease.output, expected.tobytes())  # as Triton would
    np.testing.assert_array_equal(lease.slot.read_float32(lease.output, [3]), expected)
    manager.release(lease, finished=True)

    names = {slot.names[0] for slot in pool.live}
    await manager.close()
    # Unregistered by name, then freed.
    assert not fake.cuda and set(fake.unregistered) == names
    assert not cuda_runtime.memory and len(cuda_runtime.freed) == 2


async def test_auto_prefers_cuda_when_cupy_and_a_gpu_work(
    cuda_runtime: FakeRuntime, make_manager: Callable[..., SharedMemoryManager], fake: FakeTriton
) -> None:
    manager = make_manager(transport="auto", triton_grpc_url="127.0.0.1:8001")
    await manager.connect()
    assert manager.pool is not None and manager.pool.transport == CUDA_SHM
    assert len(fake.cuda) == 2 and not fake.system


async def test_auto_takes_system_shm_when_the_cuda_region_cannot_be_allocated(
    cuda_runtime: FakeRuntime, make_manager: Callable[..., SharedMemoryManager], fake: FakeTriton
) -> None:
    cuda_runtime.capacity = 0  # every cudaMalloc fails
    manager = make_manager(transport="auto", triton_grpc_url="127.0.0.1:8001")
    await manager.connect()
    assert manager.pool is not None and manager.pool.transport == SYSTEM_SHM
    assert not fake.cuda and len(fake.system) == 2


async def test_auto_falls_back_to_grpc_when_triton_refuses_the_probe(
    make_manager: Callable[..., SharedMemoryManager], fake: FakeTriton, prefix: str, no_cuda: None
) -> None:
    fake.refusing.add("register_system_shared_memory")  # e.g. Triton cannot see our /dev/shm
    manager = make_manager(transport="auto", triton_grpc_url="127.0.0.1:8001")
    await manager.connect()
    assert manager.pool is None
    assert await manager.acquire(10**5, 10**5) is None
    # The probe's regions are gone: only our process lock is left until close.
    assert [path.name for path in SHM_DIR.glob(prefix + "-*")] == [manager.process_prefix + "_lock"]
    assert not fake.system
    await manager.connect()  # decided once: no second probe
    assert manager.pool is None and not fake.system


async def test_an_unfinished_auto_probe_leaves_nothing_behind_and_is_tried_again(
    make_manager: Callable[..., SharedMemoryManager], fake: FakeTriton, no_cuda: None
) -> None:
    manager = make_manager(transport="auto", triton_grpc_url="localhost:8001")
    probe_files = manager.process_prefix + "_[0-9]*"
    fake.refusing.add("get_system_shared_memory_status")  # Triton not reachable yet
    with pytest.raises(errors.UpstreamError, match="shared memory setup failed"):
        await manager.connect()
    assert manager.pool is None
    fake.refusing.clear()

    gate = fake.gate("register_system_shared_memory")
    hook = asyncio.ensure_future(manager.connect())
    await within(gate.entered.wait())
    assert len(list(SHM_DIR.glob(probe_files))) == 2  # the probe's slots exist now
    hook.cancel()  # e.g. the readiness monitor gave up on this connection
    with pytest.raises(asyncio.CancelledError):
        await hook
    assert manager.pool is None and not list(SHM_DIR.glob(probe_files)) and not fake.system

    fake.gates.clear()
    await manager.connect()  # still undecided: probes again, and this time it registers
    assert manager.pool is not None and manager.pool.transport == SYSTEM_SHM
    assert set(fake.system) == {name for slot in manager.pool.live for name in slot.names}


async def test_auto_sends_only_large_payloads_through_shared_memory(
    make_manager: Callable[..., SharedMemoryManager], no_cuda: None
) -> None:
    manager = make_manager(
        transport="auto", triton_grpc_url="127.0.0.1:8001", shm_auto_min_bytes=1000
    )
    await manager.connect()
    assert await manager.acquire(100, 100) is None  # small: gRPC by choice, not a fallback
    lease = await manager.acquire(1000, 1000)
    assert lease is not None and lease.transport == SYSTEM_SHM
    manager.release(lease, finished=True)
    assert manager.metrics.shm_fallbacks.labels(SYSTEM_SHM, "too_large")._value.get() == 0


async def test_explicit_system_shm_refused_by_triton_is_an_upstream_error(
    make_manager: Callable[..., SharedMemoryManager], fake: FakeTriton
) -> None:
    fake.refusing.add("register_system_shared_memory")
    manager = make_manager()
    with pytest.raises(errors.UpstreamError, match="Triton refused system_shm region"):
        await manager.connect()
    fake.refusing.clear()
    await manager.connect()  # the next connect hook registers
    assert manager.pool is not None and all(registered(fake, s) for s in manager.pool.live)
