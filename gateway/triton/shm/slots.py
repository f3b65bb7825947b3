"""Slots: the shared memory one request uses for its input and its output.

A :class:`SystemSlot` is one POSIX shared-memory object in ``/dev/shm``; a :class:`CudaSlot` is one
CUDA IPC region allocated through CuPy's CUDA runtime bindings. A slot knows how to lay out, write,
read, register and free its memory; which slot a request gets, and when a slot is retired, is the
pool's business.
"""

from __future__ import annotations

import base64
import importlib
import logging
import mmap
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from gateway.triton.shm.rpc import ADMIN_TIMEOUT_S, CUDA_SHM, SYSTEM_SHM, SharedMemoryRpc

log = logging.getLogger(__name__)

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


class _OneRegion:
    """The layout of a slot that is one region: the input at 0, the output at the next aligned
    offset after it."""

    names: tuple[str, ...]

    @staticmethod
    def fits(input_bytes: int, output_bytes: int, byte_size: int) -> bool:
        """Input and output share the region."""
        return _align(input_bytes) + output_bytes <= byte_size

    def place(self, input_bytes: int, output_bytes: int) -> tuple[Placement, Placement]:
        """Input at offset 0, output at the next aligned offset."""
        name = self.names[0]
        return Placement(name, 0, input_bytes), Placement(name, _align(input_bytes), output_bytes)


class SystemSlot(_OneRegion, Slot):
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


# What `pip install` needs for CUDA transport: the CuPy build of this machine's CUDA major version.
CUPY_PACKAGES = "cupy-cuda12x (CUDA 12) or cupy-cuda13x (CUDA 13)"
# sizeof(cudaIpcMemHandle_t): Triton's register_cuda_shared_memory takes exactly these bytes.
CUDA_IPC_HANDLE_BYTES = 64


def load_cupy() -> Any:
    """``cupy``, imported only when CUDA transport is wanted, with at least one GPU visible.

    CuPy's ``cuda.runtime`` gives the four CUDA calls a slot needs (malloc, memcpy,
    ipcGetMemHandle, free) directly. Warnings that importing it raises are logged, never raised:
    a deprecation inside a third-party package must not stop the gateway from starting (the test
    suite turns every warning into an error).
    """
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cupy = importlib.import_module("cupy")
            devices = int(cupy.cuda.runtime.getDeviceCount())
    except ImportError as exc:
        raise ShmUnavailable(
            f"transport cuda_shm needs CuPy built for this machine's CUDA: pip install "
            f"{CUPY_PACKAGES} (textscore's extras 'cuda' and 'cuda13'); and an NVIDIA "
            f"GPU ({exc})"
        ) from exc
    except Exception as exc:
        # CuPy is there but CUDA is not usable: no driver, no GPU, a CuPy of another CUDA major
        # (CUDARuntimeError, OSError for a missing library).
        raise ShmUnavailable(
            f"transport cuda_shm: CuPy is installed but CUDA is not usable here (is the CuPy "
            f"package the one of this driver's CUDA: {CUPY_PACKAGES}?): {exc}"
        ) from exc
    for warning in caught:
        log.info("importing cupy warned: %s: %s", warning.category.__name__, warning.message)
    if devices < 1:
        raise ShmUnavailable("transport cuda_shm needs an NVIDIA GPU; CUDA reports none")
    return cupy


@contextmanager
def _on_device(runtime: Any, device_id: int) -> Iterator[None]:
    """Make ``device_id`` current for an allocation and restore the caller's device after it."""
    previous = int(runtime.getDevice())
    if previous != device_id:
        runtime.setDevice(device_id)
    try:
        yield
    finally:
        if previous != device_id:
            runtime.setDevice(previous)


class CudaSlot(_OneRegion, Slot):
    """One CUDA IPC region on ``device_id``: input at 0, output at the next aligned offset.

    ``cupy`` is the CuPy module (a fake one in the unit tests); only its ``cuda.runtime`` is used.
    The memory comes from ``cudaMalloc`` itself, not from CuPy's memory pool: a pool hands out
    pieces of larger allocations, and an IPC handle names a whole allocation, so Triton would open
    the pool's block at its start instead of our piece.
    """

    transport = CUDA_SHM

    def __init__(self, name: str, byte_size: int, device_id: int, cupy: Any = None) -> None:
        super().__init__((name,), byte_size)
        self.device_id = device_id
        self._runtime = (cupy if cupy is not None else load_cupy()).cuda.runtime
        self._pointer: int | None = None
        try:
            with _on_device(self._runtime, device_id):
                self._pointer = int(self._runtime.malloc(byte_size))
            handle = self._runtime.ipcGetMemHandle(self._pointer)
        except Exception as exc:
            self.destroy()
            raise ShmUnavailable(
                f"cannot allocate CUDA memory on device {device_id}: {exc}"
            ) from exc
        if not isinstance(handle, bytes) or len(handle) != CUDA_IPC_HANDLE_BYTES:
            self.destroy()
            raise ShmUnavailable(
                f"cudaIpcGetMemHandle gave {type(handle).__name__} of "
                f"{len(handle) if isinstance(handle, bytes) else '?'} bytes, not "
                f"{CUDA_IPC_HANDLE_BYTES}"
            )
        self.ipc_handle = handle

    @property
    def allocated(self) -> bool:
        """Whether the device memory is still held (False once destroyed)."""
        return self._pointer is not None

    @property
    def raw_handle(self) -> bytes:
        """The base64 of the 64-byte ``cudaIpcMemHandle_t`` (what tritonclient's
        ``get_raw_handle`` returns and ``register_cuda_shared_memory`` decodes)."""
        return base64.b64encode(self.ipc_handle)

    def _address(self, placement: Placement, size: int) -> int:
        if self._pointer is None:
            raise ShmUnavailable(f"CUDA slot {self.names[0]} was destroyed")
        if placement.offset < 0 or placement.offset + size > self.byte_size:
            raise ValueError(
                f"{size} bytes at offset {placement.offset} overrun a {self.byte_size}-byte region"
            )
        return self._pointer + placement.offset

    def write(self, placement: Placement, data: bytes) -> None:
        """Host-to-device copy of the serialized input, finished before Triton is asked to read it."""
        if not data:
            return
        host = np.frombuffer(data, dtype=np.uint8)
        runtime = self._runtime
        runtime.memcpy(
            self._address(placement, len(data)),
            host.ctypes.data,
            len(data),
            runtime.memcpyHostToDevice,
        )
        # From pageable memory, cudaMemcpy may return while the DMA is still in flight; Triton
        # reads the region from another process, which nothing else would order after it.
        runtime.streamSynchronize(0)

    def read_float32(self, placement: Placement, shape: Sequence[int]) -> npt.NDArray[np.float32]:
        """Device-to-host copy into a fresh array (Triton finished writing before it answered)."""
        array = np.empty([int(d) for d in shape], dtype=np.float32)
        if array.nbytes:
            runtime = self._runtime
            runtime.memcpy(
                array.ctypes.data,
                self._address(placement, array.nbytes),
                array.nbytes,
                runtime.memcpyDeviceToHost,
            )
        return array

    async def register(self, client: SharedMemoryRpc, name: str) -> None:
        """Triton opens the CUDA IPC handle on the same GPU."""
        await client.register_cuda_shared_memory(
            name, self.raw_handle, self.device_id, self.byte_size, client_timeout=ADMIN_TIMEOUT_S
        )

    def destroy(self) -> None:
        """Free the device memory (once; Triton must have unregistered the region)."""
        pointer, self._pointer = self._pointer, None
        if pointer is not None:
            with _on_device(self._runtime, self.device_id):
                self._runtime.free(pointer)


@dataclass(frozen=True)
class CudaSlotFactory:
    """Makes :class:`CudaSlot` s on one GPU (a :class:`SlotFactory`)."""

    device_id: int
    # The CuPy module (``load_cupy()``'s result; a fake in the unit tests).
    cupy: Any = None
    transport: ClassVar[str] = CUDA_SHM

    @staticmethod
    def fits(input_bytes: int, output_bytes: int, byte_size: int) -> bool:
        """As :meth:`CudaSlot.fits`."""
        return CudaSlot.fits(input_bytes, output_bytes, byte_size)

    def __call__(self, name: str, byte_size: int) -> CudaSlot:
        """A new CUDA slot on ``device_id``."""
        return CudaSlot(name, byte_size, self.device_id, self.cupy)
