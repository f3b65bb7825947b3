"""Slots: the shared memory one request uses for its input and its output.

A :class:`SystemSlot` is one POSIX shared-memory object in ``/dev/shm``; a :class:`CudaSlot` is two
CUDA IPC regions. A slot knows how to lay out, write, read, register and free its memory; which
slot a request gets, and when a slot is retired, is the pool's business.
"""

from __future__ import annotations

import importlib
import mmap
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from gateway.triton.shm.rpc import ADMIN_TIMEOUT_S, CUDA_SHM, SYSTEM_SHM, SharedMemoryRpc

SHM_DIR = Path("/dev/shm")
# Outputs start on a cache-line boundary after the input.
ALIGNMENT = 64
FLOAT32_BYTES = 4


class ShmUnavailable(RuntimeError):
    """Shared memory cannot be used here (missing package, no GPU, Triton refused a region)."""


def _align(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass(frozen=True)
class Placement:
    """Where one tensor lives: region name, byte offset and byte size."""

    region: str
    offset: int
    byte_size: int


class Slot(ABC):
    """The shared memory one request uses for its input and its output.

    Slots compare and hash by identity: the pool keeps them in sets.
    """

    transport: ClassVar[str]

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
    async def register(self, client: SharedMemoryRpc, name: str) -> None:
        """Register region ``name`` of this slot with Triton."""

    @abstractmethod
    def destroy(self) -> None:
        """Free the local memory (after Triton no longer has the regions registered)."""


class SlotFactory(Protocol):
    """What a pool makes its slots with: a slot class whose constructor takes ``(name,
    byte_size)`` (e.g. ``SystemSlot`` itself), or a factory object such as
    :class:`CudaSlotFactory`."""

    @property
    def transport(self) -> str:
        """The transport label of the slots made."""

    def fits(self, input_bytes: int, output_bytes: int, byte_size: int) -> bool:
        """Whether an input and an output of these sizes fit a slot of ``byte_size``."""

    def __call__(self, name: str, byte_size: int) -> Slot:
        """A new slot whose regions are named after ``name``."""


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

    async def register(self, client: SharedMemoryRpc, name: str) -> None:
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

    async def register(self, client: SharedMemoryRpc, name: str) -> None:
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


@dataclass(frozen=True)
class CudaSlotFactory:
    """Makes :class:`CudaSlot` s on one GPU (a :class:`SlotFactory`)."""

    device_id: int
    transport: ClassVar[str] = CUDA_SHM

    @staticmethod
    def fits(input_bytes: int, output_bytes: int, byte_size: int) -> bool:
        """As :meth:`CudaSlot.fits`."""
        return CudaSlot.fits(input_bytes, output_bytes, byte_size)

    def __call__(self, name: str, byte_size: int) -> CudaSlot:
        """A new CUDA slot on ``device_id``."""
        return CudaSlot(name, byte_size, self.device_id)
