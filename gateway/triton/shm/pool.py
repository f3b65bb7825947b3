"""The region pool: a fixed number of slots of one transport, leased one request at a time.

Safety rule: a slot goes back to the pool only when its Triton call really finished with a
response. A call that was cancelled, timed out or lost its connection may still be running in
Triton and may still write into the slot, so that slot is *retired*: unregistered by name, unmapped
and replaced by a fresh slot with a new name, never reused. One reconcile worker per pool does
the unregistering and replacing in the background.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

from tritonclient.utils import InferenceServerException

from gateway.metrics import GatewayMetrics
from gateway.triton.shm.rpc import SharedMemoryRpc, registered_names, unregister_by_name
from gateway.triton.shm.slots import Placement, ShmUnavailable, Slot, SlotFactory

log = logging.getLogger(__name__)

# About a minute of retries to unregister a retired region (covers the request deadline):
# the first retry after RETRY_FIRST_DELAY_S, then doubling up to RETRY_MAX_DELAY_S.
RETIRE_ATTEMPTS = 35
RETRY_FIRST_DELAY_S = 0.1
RETRY_MAX_DELAY_S = 2.0


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
    """A fixed number of slots of one transport, leased one request at a time.

    Where each slot is, and what holds at every point where no method awaits:

    - ``_live``: the slots in service (``size`` of them once reconciled);
    - ``_registered``: the live slots whose regions Triton has, as the last status said;
    - ``_leased``: the slots a request holds;
    - ``_free``: exactly the live, registered, unleased slots, each once (empty once closed);
    - ``_retired``: slots out of service that are still to be unregistered by name and freed.

    Coroutines only ever iterate a snapshot of a list that ``release`` may change meanwhile.
    """

    def __init__(
        self,
        client: SharedMemoryRpc,
        slots: SlotFactory,
        name_prefix: str,
        size: int,
        region_bytes: int,
        acquire_timeout_s: float,
        metrics: GatewayMetrics,
    ) -> None:
        self.client = client
        self.transport = slots.transport
        self.size = size
        self.region_bytes = region_bytes
        self.acquire_timeout_s = acquire_timeout_s
        self.metrics = metrics
        self._slots = slots
        self._name_prefix = name_prefix
        self._numbers = itertools.count(1)
        self._live: list[Slot] = []
        self._retired: list[Slot] = []
        self._registered: set[Slot] = set()
        self._leased: set[Slot] = set()
        self._free: asyncio.Queue[Slot] = asyncio.Queue()
        # One reconcile (or the close) at a time: the connect hook's and the worker's.
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._worker: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def live(self) -> tuple[Slot, ...]:
        """The slots in service (a snapshot)."""
        return tuple(self._live)

    @property
    def retired(self) -> tuple[Slot, ...]:
        """The retired slots not yet unregistered and freed (a snapshot)."""
        return tuple(self._retired)

    def fits(self, input_bytes: int, output_bytes: int) -> bool:
        """Whether a request of these sizes fits one slot."""
        return self._slots.fits(input_bytes, output_bytes, self.region_bytes)

    # --- per request ------------------------------------------------------------------------------

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
        self._leased.add(slot)
        self.metrics.shm_regions_in_use.labels(self.transport).inc()
        placement_in, placement_out = slot.place(input_bytes, output_bytes)
        return Lease(self, slot, placement_in, placement_out)

    def release(self, lease: Lease, finished: bool) -> None:
        """Return a slot whose call finished; retire and replace one whose call may still run."""
        self.metrics.shm_regions_in_use.labels(self.transport).dec()
        slot = lease.slot
        self._leased.discard(slot)
        if slot not in self._live:
            # Retired meanwhile (shutdown); nothing to return.
            return
        if finished:
            # Not offered if Triton lost its regions meanwhile: the reconcile that registers them
            # again offers it.
            self._offer(slot)
            return
        self._live.remove(slot)
        self._registered.discard(slot)
        self._retired.append(slot)
        log.warning(
            "shared-memory slot retired: its Triton call did not finish with a response",
            extra={"transport": self.transport, "regions": list(slot.names)},
        )
        self._wake_worker()

    # --- reconciling with Triton ------------------------------------------------------------------

    async def reconcile(self) -> None:
        """Bring Triton and the pool in line: retired regions unregistered and freed, the pool
        refilled to its size, and every live region registered (again, after a Triton restart)."""
        async with self._lock:
            if self._closed:
                return
            registered = await registered_names(self.client, self.transport)
            # Slots whose regions Triton no longer has (it restarted) must not be leased until
            # they are registered again.
            lost = {slot for slot in self._registered if not set(slot.names) <= registered}
            if lost:
                self._registered -= lost
                self._rebuild_free()
            for slot in list(self._retired):
                if await self._unregister(slot, registered):
                    slot.destroy()
                    self._retired.remove(slot)
            while len(self._live) < self.size:
                self._live.append(self._slots(self._next_name(), self.region_bytes))
            for slot in list(self._live):
                if slot not in self._registered:
                    await self._register(slot, registered)

    async def _register(self, slot: Slot, registered: set[str]) -> None:
        for name in slot.names:
            if name not in registered:
                try:
                    await slot.register(self.client, name)
                except InferenceServerException as exc:
                    raise ShmUnavailable(
                        f"Triton refused {self.transport} region {name}: {exc.message()}"
                    ) from exc
        # A slot retired while it was being registered stays out: the next reconcile (the
        # release woke the worker) unregisters it.
        if slot in self._live:
            self._registered.add(slot)
            self._offer(slot)

    async def _unregister(self, slot: Slot, registered: set[str]) -> bool:
        done = True
        for name in slot.names:
            if name not in registered:
                continue
            try:
                await unregister_by_name(self.client, self.transport, name)
            except InferenceServerException as exc:
                # e.g. still in use by a request Triton is finishing: try again next time.
                log.warning(
                    "could not unregister shared-memory region",
                    extra={"region": name, "error": exc.message()},
                )
                done = False
        return done

    def _next_name(self) -> str:
        # Never reused: a retired slot's name may still be registered in Triton.
        return f"{self._name_prefix}_{next(self._numbers)}"

    def _offer(self, slot: Slot) -> None:
        """Put ``slot`` on the free queue if it may be leased (caller: it is not on it yet)."""
        if (
            not self._closed
            and slot in self._live
            and slot in self._registered
            and slot not in self._leased
        ):
            self._free.put_nowait(slot)

    def _rebuild_free(self) -> None:
        # No await in here, so no request can acquire or release in between.
        while not self._free.empty():
            self._free.get_nowait()
        for slot in self._live:
            self._offer(slot)

    def _wake_worker(self) -> None:
        self._idle.clear()
        self._wake.set()
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        """The pool's one reconcile worker: after each wake-up, reconcile with backoff until a
        reconcile succeeds and leaves nothing retired, at most RETIRE_ATTEMPTS times; a wake-up
        meanwhile starts a fresh round after this one."""
        while True:
            if not self._wake.is_set():
                self._idle.set()
            await self._wake.wait()
            self._wake.clear()
            delay = RETRY_FIRST_DELAY_S
            for _ in range(RETIRE_ATTEMPTS):
                # Triton refuses to unregister a region that a request it is still finishing
                # uses, so retry for a while; after that the next connect hook or the shutdown
                # tries again.
                try:
                    await self.reconcile()
                    failed = False
                except Exception:
                    log.exception("could not replace a retired shared-memory slot")
                    failed = True
                if not self._retired and not failed:
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY_S)

    async def wait_idle(self) -> None:
        """Wait until the reconcile worker has done (or given up) what retirements asked of it."""
        await self._idle.wait()

    async def close(self) -> None:
        """Unregister (by name) and free every slot; best effort when Triton is gone."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        self._idle.set()
        async with self._lock:
            slots = [*self._live, *self._retired]
            self._live.clear()
            self._retired.clear()
            self._registered.clear()
            self._rebuild_free()
            try:
                registered = await registered_names(self.client, self.transport)
            except InferenceServerException:
                registered = set()
            for slot in slots:
                await self._unregister(slot, registered)
                slot.destroy()
