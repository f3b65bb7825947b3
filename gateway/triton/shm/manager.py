"""The gateway process's shared memory: region naming, the process lock, stale-region cleanup,
the transport choice (``auto`` probe) and the one pool requests lease slots from.

Slots are registered with Triton under names that carry this process's unique prefix
(``<shm_prefix>-<hostname>-<pid>-<random>_<slot>``); each process holds an ``flock`` on
``/dev/shm/<process prefix>_lock`` for its lifetime, so a later gateway can tell the regions of a
crashed run (lock free or gone) from those of a live sibling worker (lock held) and unregister only
the former, always by name.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import re
import secrets
import socket
from urllib.parse import urlsplit

from tritonclient.utils import InferenceServerException

from gateway import errors
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.triton.shm.pool import Lease, RegionPool
from gateway.triton.shm.rpc import (
    CUDA_SHM,
    SYSTEM_SHM,
    SharedMemoryRpc,
    registered_names,
    unregister_by_name,
)
from gateway.triton.shm.slots import (
    SHM_DIR,
    CudaSlotFactory,
    ShmUnavailable,
    SlotFactory,
    SystemSlot,
    load_cupy,
)

log = logging.getLogger(__name__)

LOCK_SUFFIX = "_lock"


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


class SharedMemoryManager:
    """The gateway process's shared-memory pool, its registration and the transport choice.

    ``connect`` is the readiness monitor's connect hook: it runs after every (re)connection to
    Triton, before the warm-up, and (re)registers the pool. ``close`` runs at shutdown.
    """

    def __init__(
        self, client: SharedMemoryRpc, settings: Settings, metrics: GatewayMetrics
    ) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.mode = settings.transport
        self.prefix = settings.shm_prefix
        self.process_prefix = "-".join(
            [self.prefix, _sanitize(socket.gethostname()), str(os.getpid()), secrets.token_hex(4)]
        )
        # None until the first connect decides the transport; stays None when auto chose gRPC.
        self.pool: RegionPool | None = None
        self._lock_fd: int | None = None
        self._cleaned = False
        # auto: decided at the first connection that reaches Triton (same host and a probe
        # region registers).
        self._auto_decided = False

    @classmethod
    def from_settings(
        cls, client: SharedMemoryRpc, settings: Settings, metrics: GatewayMetrics
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
            load_cupy()  # fail at start, with the reason, not at the first request
        return cls(client, settings, metrics)

    def _new_pool(self, transport: str) -> RegionPool:
        settings = self.settings
        slots: SlotFactory = (
            CudaSlotFactory(settings.cuda_device_id, load_cupy())
            if transport == CUDA_SHM
            else SystemSlot
        )
        return RegionPool(
            self.client,
            slots,
            self.process_prefix,
            settings.shm_pool_size,
            settings.shm_region_bytes,
            settings.shm_acquire_timeout_s,
            self.metrics,
        )

    # --- process lock and stale regions -------------------------------------------------------

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

    async def _clean_stale(self, transports: list[str]) -> None:
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

    # --- lifecycle ----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect hook: clean stale regions (first time), then (re)register the pool."""
        try:
            await self._connect()
        except (ShmUnavailable, InferenceServerException, OSError) as exc:
            message = exc.message() if isinstance(exc, InferenceServerException) else str(exc)
            raise errors.UpstreamError(f"shared memory setup failed: {message}") from exc

    async def _connect(self) -> None:
        self._take_lock()
        if not self._auto_decided:
            if self.mode == "auto":
                await self._decide_auto()
            else:
                self.pool = self._new_pool(self.mode)
            self._auto_decided = True
        if not self._cleaned:
            await self._clean_stale([self.pool.transport] if self.pool is not None else [])
            self._cleaned = True
        if self.pool is not None:
            await self.pool.reconcile()

    async def _decide_auto(self) -> None:
        """auto: CUDA when CuPy and a GPU work, else system; gRPC if Triton refuses."""
        for transport in (CUDA_SHM, SYSTEM_SHM):
            if transport == CUDA_SHM:
                try:
                    load_cupy()
                except ShmUnavailable as exc:
                    log.info("transport auto: cuda_shm unusable (%s)", exc)
                    continue
            pool = self._new_pool(transport)
            try:
                await pool.reconcile()
            except (ShmUnavailable, OSError) as exc:
                # The probe: Triton could not open our region, so it is not on this host (or
                # client shm is disabled in it). Not an error in auto mode.
                log.info("transport auto: %s unusable (%s)", transport, exc)
                await pool.close()
                continue
            except BaseException:
                # Triton unreachable (or we were cancelled): undecided, the next connect probes
                # again; the probe's regions must not outlive it.
                await pool.close()
                raise
            self.pool = pool
            log.info(
                "transport auto: using %s above %d bytes",
                transport,
                self.settings.shm_auto_min_bytes,
            )
            return
        log.info("transport auto: no shared memory works with this Triton; using gRPC")

    async def close(self) -> None:
        """Shutdown: unregister (by name) and free every region, then drop our lock file."""
        if self.pool is not None:
            await self.pool.close()
        if self._lock_fd is not None:
            (SHM_DIR / (self.process_prefix + LOCK_SUFFIX)).unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- per request ------------------------------------------------------------------------------

    async def acquire(self, input_bytes: int, output_bytes: int) -> Lease | None:
        """A slot for a request, or None to send it over gRPC (fallbacks are counted)."""
        pool = self.pool
        if pool is None:
            return None
        if self.mode == "auto" and input_bytes + output_bytes < self.settings.shm_auto_min_bytes:
            # Small payloads are faster over gRPC (docs/shared-memory.md): a choice, not a fallback.
            return None
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
