"""Shared-memory tensor transfer between the gateway and Triton: system (``/dev/shm``) and CUDA.

A request leases a *slot* from a fixed pool, writes its serialized input into it, asks Triton to
write the output into it and reads the output back from it.

- :mod:`.rpc`: the shared-memory RPCs of Triton (a protocol) and by-name unregistering;
- :mod:`.slots`: the slot types (system, CUDA) and where a tensor goes in a slot;
- :mod:`.pool`: leasing, retiring and reconciling the slots of one transport;
- :mod:`.manager`: naming, the process lock, stale cleanup, the ``auto`` probe.

Safety rule: a slot goes back to the pool only when its Triton call really finished with a
response. A call that was cancelled, timed out or lost its connection may still be running in
Triton and may still write into the slot, so that slot is *retired*: unregistered by name, unmapped
and replaced by a fresh slot with a new name, never reused.
"""

from gateway.triton.shm.manager import SharedMemoryManager, is_loopback_url
from gateway.triton.shm.pool import Lease, RegionPool
from gateway.triton.shm.rpc import (
    CUDA_SHM,
    SYSTEM_SHM,
    SharedMemoryRpc,
    registered_names,
    unregister_by_name,
)
from gateway.triton.shm.slots import (
    FLOAT32_BYTES,
    SHM_DIR,
    CudaSlot,
    CudaSlotFactory,
    Placement,
    ShmUnavailable,
    Slot,
    SystemSlot,
    load_cupy,
)

__all__ = [
    "CUDA_SHM",
    "FLOAT32_BYTES",
    "SHM_DIR",
    "SYSTEM_SHM",
    "CudaSlot",
    "CudaSlotFactory",
    "Lease",
    "Placement",
    "RegionPool",
    "SharedMemoryManager",
    "SharedMemoryRpc",
    "ShmUnavailable",
    "Slot",
    "SystemSlot",
    "is_loopback_url",
    "load_cupy",
    "registered_names",
    "unregister_by_name",
]
