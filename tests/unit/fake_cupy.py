"""A stand-in for the ``cupy`` module: ``cuda.runtime`` over device memory kept in bytearrays.

It has exactly the runtime calls :class:`gateway.triton.shm.CudaSlot` makes. Copies read and
write real host memory at the addresses the slot passes (``ctypes``), so a test sees the bytes a
real ``cudaMemcpy`` would have moved; device addresses are made up and never dereferenced.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# Device addresses: far apart, so that an offset past one allocation never lands in another.
BASE_ADDRESS = 0x7F00_0000_0000
SPACING = 1 << 32


class CUDARuntimeError(RuntimeError):
    """What cupy raises for a failed runtime call."""


@dataclass
class FakeRuntime:
    """``cupy.cuda.runtime`` (CUDA's camelCase names): malloc, free, memcpy, ipcGetMemHandle."""

    device_count: int = 1
    # Allocations that would fail (cudaErrorMemoryAllocation) once this many bytes are live.
    capacity: int = 1 << 30
    memcpyHostToDevice: int = 1
    memcpyDeviceToHost: int = 2
    current: int = 0
    # Live allocations: address -> (device, memory).
    memory: dict[int, tuple[int, bytearray]] = field(default_factory=dict)
    freed: list[int] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    _next: int = 0

    def getDeviceCount(self) -> int:
        return self.device_count

    def getDevice(self) -> int:
        return self.current

    def setDevice(self, device: int) -> None:
        if not 0 <= device < self.device_count:
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        self.calls.append(("setDevice", device))
        self.current = device

    def malloc(self, size: int) -> int:
        if sum(len(mem) for _, mem in self.memory.values()) + size > self.capacity:
            raise CUDARuntimeError("cudaErrorMemoryAllocation: out of memory")
        address = BASE_ADDRESS + self._next * SPACING
        self._next += 1
        self.memory[address] = (self.current, bytearray(size))
        self.calls.append(("malloc", size, self.current))
        return address

    def free(self, address: int) -> None:
        if address not in self.memory:
            raise CUDARuntimeError("cudaErrorInvalidValue: not an allocation")
        del self.memory[address]
        self.freed.append(address)
        self.calls.append(("free", address, self.current))

    def _find(self, address: int, size: int) -> tuple[bytearray, int]:
        for base, (_, mem) in self.memory.items():
            if base <= address and address + size <= base + len(mem):
                return mem, address - base
        raise CUDARuntimeError(f"cudaErrorInvalidValue: {size} bytes at {address:#x}")

    def memcpy(self, dst: int, src: int, size: int, kind: int) -> None:
        self.calls.append(("memcpy", dst, src, size, kind))
        if kind == self.memcpyHostToDevice:
            mem, offset = self._find(dst, size)
            mem[offset : offset + size] = ctypes.string_at(src, size)
        elif kind == self.memcpyDeviceToHost:
            mem, offset = self._find(src, size)
            ctypes.memmove(dst, bytes(mem[offset : offset + size]), size)
        else:
            raise CUDARuntimeError(f"unexpected memcpy kind {kind}")

    def streamSynchronize(self, stream: int) -> None:
        self.calls.append(("streamSynchronize", stream))

    @staticmethod
    def handle_of(address: int) -> bytes:
        """The 64 opaque bytes of ``address``'s IPC handle."""
        return hashlib.sha512(address.to_bytes(8, "little")).digest()

    def ipcGetMemHandle(self, address: int) -> bytes:
        if address not in self.memory:
            raise CUDARuntimeError("cudaErrorInvalidValue: not the start of an allocation")
        return self.handle_of(address)

    def device_bytes(self, address: int) -> bytes:
        """The whole allocation at ``address``."""
        return bytes(self.memory[address][1])


def fake_cupy(runtime: FakeRuntime | None = None) -> Any:
    """A module-like object with ``cuda.runtime`` (all a CUDA slot touches of cupy)."""
    return SimpleNamespace(cuda=SimpleNamespace(runtime=runtime or FakeRuntime()))
