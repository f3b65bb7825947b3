"""Shared-memory tensor transfer between the gateway and Triton: system (``/dev/shm``) and CUDA.

A request leases a *slot* from a fixed pool, writes its serialized input into it, asks Triton to
write the output into it and reads the output back from it. Slots are registered with Triton
under names that carry this process's unique prefix
(``<shm_prefix>-<hostname>-<pid>-<random>_<slot>``); each process holds an ``flock`` on
``/dev/shm/<process prefix>_lock`` for its lifetime, so a later gateway can tell the regions of a
crashed run (lock free or gone) from those of a live sibling worker (lock held) and unregister only
the former, always by name.

Safety rule: a slot goes back to the pool only when its Triton call really finished with a
response. A call that was cancelled, timed out or lost its connection may still be running in
Triton and may still write into the slot, so that slot is *retired*: unregistered by name, unmapped
and replaced by a fresh slot with a new name, never reused.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib
import ipaddress
import logging
import mmap
import os
import re
import secrets
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt
from tritonclient.utils import InferenceServerException

from gateway import errors
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings

log = logging.getLogger(__name__)

SYSTEM_SHM = "system_shm"
CUDA_SHM = "cuda_shm"
SHM_DIR = Path("/dev/shm")
LOCK_SUFFIX = "_lock"
# Outputs start on a cache-line boundary after the input.
ALIGNMENT = 64
FLOAT32_BYTES = 4
# The registration calls are small control-plane RPCs.
ADMIN_TIMEOUT_S = 5.0
# About a minute of retries to unregister a retired region (covers the request deadline).
RETIRE_ATTEMPTS = 35


class ShmUnavailable(RuntimeError):
    """Shared memory cannot be used here (missing package, no GPU, Triton refused a region)."""


def _align(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _sanitize(text: str) -> str:
    # "_" separates the process prefix from the slot part of a name, so it may not occur before.
    return re.sub(r"[^A-Za-z0-9.-]", "-", text)[:40] or "host"


def process_prefix_of(name: str) -> str:
    """The per-process prefix of a region or ``/dev/shm`` name (everything before the first ``_``)."""
    return name.partition("_")[0]


def is_loopback_url(url: str) -> bool:
    """Whether the host of a ``host:port`` gRPC URL is this machine's loopback."""
    host = urlsplit("//" + url.removeprefix("dns:///")).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Placement:
    """Where one tensor lives: region name, byte offset and byte size."""

    region: str
    offset: int
    byte_size: int


class Slot(ABC):
    """The shared memory one request uses for its input and its output."""

    transport: str

    def __init__(self, names: tuple[str, ...], byte_size: int) -> None:
        self.names = names
        self.byte_size = byte_size

    @staticmethod
    @abstractmethod
    def fits(input_bytes: int, output_bytes: int, byte_size: int) -> bool:
        """Whether an input and an output of these sizes fit a slot of ``byte_size``."""

    @abstractmethod
    def place(self, input_bytes: int, output_bytes: int) -> tuple[Placement, Placement]:
        """The input's and the output's placement (call only when ``fits``)."""

    @abstractmethod
    def write(self, placement: Placement, data: bytes) -> None:
        """Copy ``data`` (a serialized input) into the slot."""

    @abstractmethod
    def read_float32(self, placement: Placement, shape: Sequence[int]) -> npt.NDArray[np.float32]:
        """A copy of an FP32 output: the slot is reused as soon as it is released."""

    @abstractmethod
    async def register(self, client: Any, name: str) -> None:
        """Register region ``name`` of this slot with Triton."""

    @abstractmethod
    def destroy(self) -> None:
        """Free the local memory (after Triton no longer has the regions registered)."""


class SystemSlot(Slot):
    """One POSIX shared-memory object in ``/dev/shm``: input at 0, output after it, aligned."""

    transport = SYSTEM_SHM

    def __init__(self, name: str, byte_size: int) -> None:
        super().__init__((name,), byte_size)
        # O_EXCL: never adopt someone else's object. 0600: Triton must run as the same uid or
        # as root (see docs/shared-memory.md).
        fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, byte_size)
            self._map = mmap.mmap(fd, byte_size)
        except BaseException:
            (SHM_DIR / name).unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    @staticmethod
    def fits(input_bytes: int, output_bytes: int, byte_size: int) -> bool:
        """Input and output share the region."""
        return _align(input_bytes) + output_bytes <= byte_size

    def place(self, input_bytes: int, output_bytes: int) -> tuple[Placement, Placement]:
        """Input at offset 0, output at the next aligned offset."""
        name = self.names[0]
        return Placement(name, 0, input_bytes), Placement(name, _align(input_bytes), output_bytes)

    def write(self, placement: Placement, data: bytes) -> None:
        """One memcpy into the mapping."""
        self._map[placement.offset : placement.offset + len(data)] = data

    def read_float32(self, placement: Placement, shape: Sequence[int]) -> npt.NDArray[np.float32]:
        """Copy the output out of the mapping."""
        count = int(np.prod(shape))
        view = np.frombuffer(self._map, dtype=np.float32, count=count, offset=placement.offset)
        return view.reshape(shape).copy()

    async def register(self, client: Any, name: str) -> None:
        """Triton opens the object by its key (``/`` + name) and maps it itself."""
        await client.register_system_shared_memory(
            name, "/" + name, self.byte_size, client_timeout=ADMIN_TIMEOUT_S
        )

    def destroy(self) -> None:
        """Unmap and unlink (Triton's own mapping, if any, stays valid until it unmaps)."""
        self._map.close()
        (SHM_DIR / self.names[0]).unlink(missing_ok=True)


def load_cuda_shared_memory() -> ModuleType:
    """``tritonclient.utils.cuda_shared_memory``, imported only when CUDA transport is wanted."""
    try:
        return importlib.import_module("tritonclient.utils.cuda_shared_memory")
    except (ImportError, RuntimeError) as exc:
        raise ShmUnavailable(
            "transport cuda_shm needs the 'cuda-python' package (pip install "
            "'tritonclient[cuda]==2.51.0'), setuptools<81 (tritonclient 2.51 imports "
            f"pkg_resources) and an NVIDIA GPU: {exc}"
        ) from exc


class CudaSlot(Slot):
    """Two CUDA IPC regions on ``device_id``: one for the input, one for the output.

    Two regions because tritonclient's copy helpers only read and write at offset 0.
    """

    transport = CUDA_SHM

    def __init__(self, name: str, byte_size: int, device_id: int) -> None:
        super().__init__((name + "i", name + "o"), byte_size)
        self._cudashm = load_cuda_shared_memory()
        self.device_id = device_id
        self._handles: dict[str, Any] = {}
        try:
            for region in self.names:
                self._handles[region] = self._cudashm.create_shared_memory_region(
                    region, byte_size, device_id
                )
        except Exception as exc:
            self.destroy()
            raise ShmUnavailable(
                f"cannot allocate CUDA memory on device {device_id}: {exc}"
            ) from exc

    @staticmethod
    def fits(input_bytes: int, output_bytes: int, byte_size: int) -> bool:
        """Each tensor has a region of its own."""
        return input_bytes <= byte_size and output_bytes <= byte_size

    def place(self, input_bytes: int, output_bytes: int) -> tuple[Placement, Placement]:
        """Input and output each at offset 0 of their region."""
        return Placement(self.names[0], 0, input_bytes), Placement(self.names[1], 0, output_bytes)

    def write(self, placement: Placement, data: bytes) -> None:
        """Host-to-device copy of the serialized input."""
        self._cudashm.set_shared_memory_region(
            self._handles[placement.region], [np.array([data], dtype=np.object_)]
        )

    def read_float32(self, placement: Placement, shape: Sequence[int]) -> npt.NDArray[np.float32]:
        """Device-to-host copy (the helper already returns a copy)."""
        array: npt.NDArray[np.float32] = self._cudashm.get_contents_as_numpy(
            self._handles[placement.region], np.float32, list(shape)
        )
        return array

    async def register(self, client: Any, name: str) -> None:
        """Triton opens the CUDA IPC handle on the same GPU."""
        await client.register_cuda_shared_memory(
            name,
            self._cudashm.get_raw_handle(self._handles[name]),
            self.device_id,
            self.byte_size,
            client_timeout=ADMIN_TIMEOUT_S,
        )

    def destroy(self) -> None:
        """Free the device memory."""
        for handle in self._handles.values():
            self._cudashm.destroy_shared_memory_region(handle)
        self._handles.clear()


async def registered_names(client: Any, transport: str) -> set[str]:
    """Names of every region of ``transport`` that Triton has registered (any client's)."""
    if transport == SYSTEM_SHM:
        status = await client.get_system_shared_memory_status(client_timeout=ADMIN_TIMEOUT_S)
    else:
        status = await client.get_cuda_shared_memory_status(client_timeout=ADMIN_TIMEOUT_S)
    return set(status.regions.keys())


async def unregister_by_name(client: Any, transport: str, name: str) -> None:
    """Unregister exactly one region. An empty name would unregister every client's regions."""
    if not name:
        raise ValueError("refusing to unregister shared memory without a region name")
    if transport == SYSTEM_SHM:
        await client.unregister_system_shared_memory(name, client_timeout=ADMIN_TIMEOUT_S)
    else:
        await client.unregister_cuda_shared_memory(name, client_timeout=ADMIN_TIMEOUT_S)


@dataclass
class Lease:
    """A slot held by one request and where its input and output go in it."""

    pool: RegionPool
    slot: Slot
    input: Placement
    output: Placement

    @property
    def transport(self) -> str:
        """The transport label of the slot."""
        return self.slot.transport


class RegionPool:
    """A fixed number of slots of one transport, leased one request at a time."""

    def __init__(
        self,
        transport: str,
        factory: Callable[[str], Slot],
        fits: Callable[[int, int, int], bool],
        names: Callable[[], str],
        size: int,
        region_bytes: int,
        acquire_timeout_s: float,
        metrics: GatewayMetrics,
    ) -> None:
        self.transport = transport
        self.size = size
        self.region_bytes = region_bytes
        self.acquire_timeout_s = acquire_timeout_s
        self.metrics = metrics
        self._factory = factory
        self._fits = fits
        self._names = names
        self.live: list[Slot] = []
        self.retired: list[Slot] = []
        self._free: asyncio.Queue[Slot] = asyncio.Queue()
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self._leased: set[int] = set()
        self._client: Any = None
        self._closed = False

    def fits(self, input_bytes: int, output_bytes: int) -> bool:
        """Whether a request of these sizes fits one slot."""
        return self._fits(input_bytes, output_bytes, self.region_bytes)

    @property
    def names(self) -> set[str]:
        """Every region name this pool still owns (live and retired)."""
        return {name for slot in [*self.live, *self.retired] for name in slot.names}

    async def acquire(self, input_bytes: int, output_bytes: int) -> Lease | None:
        """A free slot, waiting at most ``acquire_timeout_s``; None when none came free."""
        if self._free.empty():
            self.metrics.shm_waits.labels(self.transport).inc()
        try:
            if self.acquire_timeout_s > 0:
                slot = await asyncio.wait_for(self._free.get(), self.acquire_timeout_s)
            else:
                slot = self._free.get_nowait()
        except (TimeoutError, asyncio.TimeoutError, asyncio.QueueEmpty):
            return None
        self._leased.add(id(slot))
        self.metrics.shm_regions_in_use.labels(self.transport).inc()
        placement_in, placement_out = slot.place(input_bytes, output_bytes)
        return Lease(self, slot, placement_in, placement_out)

    def release(self, lease: Lease, finished: bool) -> None:
        """Return a slot whose call finished; retire and replace one whose call may still run."""
        self.metrics.shm_regions_in_use.labels(self.transport).dec()
        slot = lease.slot
        self._leased.discard(id(slot))
        if slot not in self.live:
            # Retired meanwhile (shutdown); nothing to return.
            return
        if finished and not self._closed:
            self._free.put_nowait(slot)
            return
        self.live.remove(slot)
        self.retired.append(slot)
        if not self._closed and self._client is not None:
            log.warning(
                "shared-memory slot retired: its Triton call did not finish with a response",
                extra={"transport": self.transport, "regions": list(slot.names)},
            )
            task = asyncio.get_running_loop().create_task(self._reconcile_logged())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _reconcile_logged(self) -> None:
        # Triton refuses to unregister a region that a request it is still finishing uses, so
        # retry for a while; after that the next connect hook or the shutdown tries again.
        delay = 0.1
        for _ in range(RETIRE_ATTEMPTS):
            try:
                await self.reconcile(self._client)
            except Exception:
                log.exception("could not replace a retired shared-memory slot")
            if not self.retired or self._closed:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def reconcile(self, client: Any) -> None:
        """Bring Triton and the pool in line: retired regions unregistered and freed, the pool
        refilled to its size, and every live region registered (again, after a Triton restart)."""
        async with self._lock:
            self._client = client
            registered = await registered_names(client, self.transport)
            for slot in list(self.retired):
                if await self._unregister(client, slot, registered):
                    slot.destroy()
                    self.retired.remove(slot)
            while len(self.live) < self.size:
                self.live.append(self._factory(self._names()))
            for slot in self.live:
                for name in slot.names:
                    if name not in registered:
                        try:
                            await slot.register(client, name)
                        except InferenceServerException as exc:
                            raise ShmUnavailable(
                                f"Triton refused {self.transport} region {name}: {exc.message()}"
                            ) from exc
            # Rebuild the free queue: every live slot that no request holds. (No await from here
            # on, so no request can acquire or release in between.)
            while not self._free.empty():
                self._free.get_nowait()
            for slot in self.live:
                if id(slot) not in self._leased:
                    self._free.put_nowait(slot)

    async def _unregister(self, client: Any, slot: Slot, registered: set[str]) -> bool:
        done = True
        for name in slot.names:
            if name not in registered:
                continue
            try:
                await unregister_by_name(client, self.transport, name)
            except InferenceServerException as exc:
                # e.g. still in use by a request Triton is finishing: try again next time.
                log.warning(
                    "could not unregister shared-memory region",
                    extra={"region": name, "error": exc.message()},
                )
                done = False
        return done

    async def close(self, client: Any) -> None:
        """Unregister (by name) and free every slot; best effort when Triton is gone."""
        self._closed = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        async with self._lock:
            slots = [*self.live, *self.retired]
            self.live.clear()
            self.retired.clear()
            try:
                registered = await registered_names(client, self.transport)
            except InferenceServerException:
                registered = set()
            for slot in slots:
                await self._unregister(client, slot, registered)
                slot.destroy()
            while not self._free.empty():
                self._free.get_nowait()


class SharedMemoryManager:
    """The gateway process's shared-memory pools, their registration and the transport choice.

    ``connect`` is the readiness monitor's connect hook: it runs after every (re)connection to
    Triton, before the warm-up, and (re)registers the pools. ``close`` runs at shutdown.
    """

    def __init__(self, client: Any, settings: Settings, metrics: GatewayMetrics) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.mode = settings.transport
        self.prefix = settings.shm_prefix
        self.process_prefix = "-".join(
            [self.prefix, _sanitize(socket.gethostname()), str(os.getpid()), secrets.token_hex(4)]
        )
        self.pools: dict[str, RegionPool] = {}
        self._counter = 0
        self._lock_fd: int | None = None
        self._cleaned = False
        # auto: decided at the first connection (same host and a probe region registers).
        self._auto_decided = False

    @classmethod
    def from_settings(
        cls, client: Any, settings: Settings, metrics: GatewayMetrics
    ) -> SharedMemoryManager | None:
        """A manager for ``settings.transport``, or None for plain gRPC (or auto off-host)."""
        if settings.transport == "grpc":
            return None
        if settings.transport == "auto" and not (
            settings.shm_same_host or is_loopback_url(settings.triton_grpc_url)
        ):
            log.info("transport auto: Triton is not on this host; using gRPC")
            return None
        if settings.transport == CUDA_SHM:
            load_cuda_shared_memory()  # fail at start, with the reason, not at the first request
        return cls(client, settings, metrics)

    def _next_name(self) -> str:
        self._counter += 1
        return f"{self.process_prefix}_{self._counter}"

    def _pool(self, transport: str) -> RegionPool:
        settings = self.settings
        factory: Callable[[str], Slot]
        fits: Callable[[int, int, int], bool]
        if transport == CUDA_SHM:
            device = settings.cuda_device_id

            def factory(name: str) -> Slot:
                return CudaSlot(name, settings.shm_region_bytes, device)

            fits = CudaSlot.fits
        else:

            def factory(name: str) -> Slot:
                return SystemSlot(name, settings.shm_region_bytes)

            fits = SystemSlot.fits
        return RegionPool(
            transport,
            factory,
            fits,
            self._next_name,
            settings.shm_pool_size,
            settings.shm_region_bytes,
            settings.shm_acquire_timeout_s,
            self.metrics,
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def _take_lock(self) -> None:
        """Hold an flock on our lock file for the process's life; it dies with the process."""
        if self._lock_fd is not None:
            return
        final = SHM_DIR / (self.process_prefix + LOCK_SUFFIX)
        staging = SHM_DIR / (self.process_prefix + LOCK_SUFFIX + ".new")
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Renamed only once locked, so no one ever sees our lock file unlocked.
        os.rename(staging, final)
        self._lock_fd = fd

    def _is_stale(self, process_prefix: str) -> bool:
        """A process prefix of our deployment whose owner is gone (its lock is free or missing)."""
        if process_prefix == self.process_prefix or not process_prefix.startswith(
            self.prefix + "-"
        ):
            return False
        try:
            fd = os.open(SHM_DIR / (process_prefix + LOCK_SUFFIX), os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True

    async def _clean_stale(self, transports: Sequence[str]) -> None:
        """Unregister, by name, regions a crashed run of this deployment left; remove its files."""
        for transport in transports:
            for name in sorted(await registered_names(self.client, transport)):
                if self._is_stale(process_prefix_of(name)):
                    log.warning(
                        "unregistering a stale shared-memory region", extra={"region": name}
                    )
                    await unregister_by_name(self.client, transport, name)
        self._remove_stale_files()

    def _remove_stale_files(self) -> None:
        for path in SHM_DIR.glob(self.prefix + "-*"):
            if self._is_stale(process_prefix_of(path.name)):
                log.warning("removing a stale shared-memory object", extra={"path": str(path)})
                path.unlink(missing_ok=True)

    async def connect(self) -> None:
        """Connect hook: clean stale regions (first time), then (re)register every pool."""
        try:
            await self._connect()
        except (ShmUnavailable, InferenceServerException, OSError) as exc:
            message = exc.message() if isinstance(exc, InferenceServerException) else str(exc)
            raise errors.UpstreamError(f"shared memory setup failed: {message}") from exc

    async def _connect(self) -> None:
        self._take_lock()
        if not self._auto_decided:
            self._auto_decided = True
            if self.mode == "auto":
                await self._decide_auto()
            else:
                self.pools[self.mode] = self._pool(self.mode)
        if not self._cleaned:
            await self._clean_stale(list(self.pools))
            self._cleaned = True
        for pool in self.pools.values():
            await pool.reconcile(self.client)

    async def _decide_auto(self) -> None:
        """auto: CUDA when cuda-python and the GPU work, else system; gRPC if Triton refuses."""
        for transport in (CUDA_SHM, SYSTEM_SHM):
            if transport == CUDA_SHM:
                try:
                    load_cuda_shared_memory()
                except ShmUnavailable:
                    continue
            pool = self._pool(transport)
            try:
                await pool.reconcile(self.client)
            except (ShmUnavailable, OSError) as exc:
                # The probe: Triton could not open our region, so it is not on this host (or
                # client shm is disabled in it). Not an error in auto mode.
                log.info("transport auto: %s unusable (%s)", transport, exc)
                await pool.close(self.client)
                continue
            self.pools[transport] = pool
            log.info(
                "transport auto: using %s above %d bytes",
                transport,
                self.settings.shm_auto_min_bytes,
            )
            return
        log.info("transport auto: no shared memory works with this Triton; using gRPC")

    async def close(self) -> None:
        """Shutdown: unregister (by name) and free every region, then drop our lock file."""
        for pool in self.pools.values():
            await pool.close(self.client)
        if self._lock_fd is not None:
            (SHM_DIR / (self.process_prefix + LOCK_SUFFIX)).unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- per request ------------------------------------------------------------------------------

    async def acquire(self, input_bytes: int, output_bytes: int) -> Lease | None:
        """A slot for a request, or None to send it over gRPC (fallbacks are counted)."""
        if not self.pools:
            return None
        if self.mode == "auto" and input_bytes + output_bytes < self.settings.shm_auto_min_bytes:
            # Small payloads are faster over gRPC (docs/shared-memory.md): a choice, not a fallback.
            return None
        pool = next(iter(self.pools.values()))
        if not pool.fits(input_bytes, output_bytes):
            self.metrics.shm_fallbacks.labels(pool.transport, "too_large").inc()
            return None
        lease = await pool.acquire(input_bytes, output_bytes)
        if lease is None:
            self.metrics.shm_fallbacks.labels(pool.transport, "pool_exhausted").inc()
        return lease

    def release(self, lease: Lease, finished: bool) -> None:
        """Give the slot back (``finished``: Triton answered, so it no longer touches the slot)."""
        lease.pool.release(lease, finished)
