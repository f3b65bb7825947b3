"""The six shared-memory RPCs of Triton that the gateway uses, and the two safe wrappers over them.

``tritonclient.grpc.aio.InferenceServerClient`` satisfies :class:`SharedMemoryRpc` structurally;
tests pass an in-memory fake instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

SYSTEM_SHM = "system_shm"
CUDA_SHM = "cuda_shm"
# The registration calls are small control-plane RPCs.
ADMIN_TIMEOUT_S = 5.0


class SharedMemoryStatus(Protocol):
    """A ``*SharedMemoryStatusResponse``: the registered regions by name."""

    @property
    def regions(self) -> Mapping[str, Any]:
        """Every registered region of one kind (any client's), by name."""


class SharedMemoryRpc(Protocol):
    """Triton's shared-memory extension as the gateway calls it (the aio gRPC client's methods).

    Only the parameters the gateway passes are listed; ``client_timeout`` is the gRPC deadline.
    """

    async def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, *, client_timeout: float | None = None
    ) -> None:
        """Register the POSIX shared-memory object ``key`` as region ``name``."""

    async def unregister_system_shared_memory(
        self, name: str = "", *, client_timeout: float | None = None
    ) -> None:
        """Unregister system region ``name``; without a name, every client's system regions."""

    async def get_system_shared_memory_status(
        self, *, client_timeout: float | None = None
    ) -> SharedMemoryStatus:
        """The registered system regions."""

    async def register_cuda_shared_memory(
        self,
        name: str,
        raw_handle: bytes,
        device_id: int,
        byte_size: int,
        *,
        client_timeout: float | None = None,
    ) -> None:
        """Register the CUDA IPC handle ``raw_handle`` on ``device_id`` as region ``name``."""

    async def unregister_cuda_shared_memory(
        self, name: str = "", *, client_timeout: float | None = None
    ) -> None:
        """Unregister CUDA region ``name``; without a name, every client's CUDA regions."""

    async def get_cuda_shared_memory_status(
        self, *, client_timeout: float | None = None
    ) -> SharedMemoryStatus:
        """The registered CUDA regions."""


async def registered_names(client: SharedMemoryRpc, transport: str) -> set[str]:
    """Names of every region of ``transport`` that Triton has registered (any client's)."""
    if transport == SYSTEM_SHM:
        status = await client.get_system_shared_memory_status(client_timeout=ADMIN_TIMEOUT_S)
    else:
        status = await client.get_cuda_shared_memory_status(client_timeout=ADMIN_TIMEOUT_S)
    return set(status.regions.keys())


async def unregister_by_name(client: SharedMemoryRpc, transport: str, name: str) -> None:
    """Unregister exactly one region. An empty name would unregister every client's regions."""
    if not name:
        raise ValueError("refusing to unregister shared memory without a region name")
    if transport == SYSTEM_SHM:
        await client.unregister_system_shared_memory(name, client_timeout=ADMIN_TIMEOUT_S)
    else:
        await client.unregister_cuda_shared_memory(name, client_timeout=ADMIN_TIMEOUT_S)
