"""CUDA slots over a fake ``cupy`` (no GPU, no server): sizes, offsets, handles, freeing, and the
import of CuPy itself."""

from __future__ import annotations

import base64
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gateway.triton.shm import CudaSlot, CudaSlotFactory, Placement, ShmUnavailable, load_cupy
from gateway.triton.shm.slots import ALIGNMENT, CUDA_IPC_HANDLE_BYTES
from tests.unit.fake_cupy import FakeRuntime, fake_cupy

REGION_BYTES = 4096


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime(device_count=2)


def only_allocation(runtime: FakeRuntime) -> int:
    (address,) = runtime.memory
    return address


def test_a_slot_is_one_region_of_the_asked_size_on_the_asked_gpu(runtime: FakeRuntime) -> None:
    slot = CudaSlot("gw_1", REGION_BYTES, device_id=1, cupy=fake_cupy(runtime))
    assert slot.names == ("gw_1",) and slot.byte_size == REGION_BYTES
    address = only_allocation(runtime)
    device, memory = runtime.memory[address]
    assert (device, len(memory)) == (1, REGION_BYTES)
    # Allocated with device 1 current, then the caller's device 0 made current again.
    assert ("malloc", REGION_BYTES, 1) in runtime.calls and runtime.current == 0
    slot.destroy()


def test_write_and_read_copy_the_right_bytes_at_the_right_offsets(runtime: FakeRuntime) -> None:
    slot = CudaSlot("gw_1", REGION_BYTES, device_id=0, cupy=fake_cupy(runtime))
    payload = b"\x05\x00\x00\x00hello"
    placed_in, placed_out = slot.place(len(payload), 3 * 4)
    assert (placed_in.offset, placed_in.byte_size) == (0, len(payload))
    assert (placed_out.offset, placed_out.byte_size) == (ALIGNMENT, 12)  # cache-line aligned
    assert CudaSlot.fits(REGION_BYTES - ALIGNMENT, ALIGNMENT, REGION_BYTES)
    assert not CudaSlot.fits(REGION_BYTES - ALIGNMENT + 1, ALIGNMENT, REGION_BYTES)

    slot.write(placed_in, payload)
    memory = runtime.device_bytes(only_allocation(runtime))
    assert memory[: len(payload)] == payload and memory[len(payload) :] == bytes(
        REGION_BYTES - len(payload)
    )
    # The copy is finished before the request goes to Triton.
    assert runtime.calls[-1] == ("streamSynchronize", 0)

    # Triton writes the output at its offset; the slot reads exactly those bytes back.
    expected = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    written = bytearray(runtime.memory[only_allocation(runtime)][1])
    written[ALIGNMENT : ALIGNMENT + 12] = expected.tobytes()
    runtime.memory[only_allocation(runtime)][1][:] = written
    got = slot.read_float32(placed_out, [1, 3])
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.float32 and got.flags.owndata  # a copy: the slot is reused next
    assert slot.read_float32(placed_in, [0]).shape == (0,)

    with pytest.raises(ValueError, match="overrun"):
        slot.write(Placement("gw_1", REGION_BYTES - 2, 4), b"four")
    slot.destroy()


def test_the_raw_handle_is_the_base64_of_the_64_byte_ipc_handle(runtime: FakeRuntime) -> None:
    slot = CudaSlot("gw_1", REGION_BYTES, device_id=0, cupy=fake_cupy(runtime))
    handle = FakeRuntime.handle_of(only_allocation(runtime))
    assert len(handle) == CUDA_IPC_HANDLE_BYTES
    assert slot.raw_handle == base64.b64encode(handle)
    assert base64.b64decode(slot.raw_handle) == handle
    slot.destroy()


def test_a_wrong_sized_handle_is_refused_and_its_memory_freed(runtime: FakeRuntime) -> None:
    runtime.ipcGetMemHandle = lambda address: b"short"  # type: ignore[method-assign]
    with pytest.raises(ShmUnavailable, match="not 64"):
        CudaSlot("gw_1", REGION_BYTES, device_id=0, cupy=fake_cupy(runtime))
    assert not runtime.memory and len(runtime.freed) == 1


def test_destroy_frees_once_and_the_slot_is_unusable_after(runtime: FakeRuntime) -> None:
    slot = CudaSlot("gw_1", REGION_BYTES, device_id=1, cupy=fake_cupy(runtime))
    address = only_allocation(runtime)
    assert slot.allocated
    slot.destroy()
    assert not slot.allocated
    slot.destroy()  # idempotent: the pool may close after a retirement already freed it
    assert runtime.freed == [address] and not runtime.memory
    assert ("free", address, 1) in runtime.calls and runtime.current == 0
    with pytest.raises(ShmUnavailable, match="destroyed"):
        slot.write(Placement("gw_1", 0, 1), b"x")


def test_a_failed_allocation_is_shm_unavailable(runtime: FakeRuntime) -> None:
    runtime.capacity = REGION_BYTES - 1
    with pytest.raises(ShmUnavailable, match="cannot allocate CUDA memory on device 0"):
        CudaSlot("gw_1", REGION_BYTES, device_id=0, cupy=fake_cupy(runtime))
    assert not runtime.memory


def test_the_factory_makes_slots_with_its_cupy(runtime: FakeRuntime) -> None:
    factory = CudaSlotFactory(1, fake_cupy(runtime))
    slot = factory("gw_7", REGION_BYTES)
    assert slot.device_id == 1 and factory.transport == "cuda_shm"
    assert factory.fits(8, 8, REGION_BYTES)
    slot.destroy()
    assert not runtime.memory


# --- importing CuPy -----------------------------------------------------------------------------


def test_missing_cupy_names_the_packages_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ModuleNotFoundError
    with pytest.raises(ShmUnavailable, match=r"cupy-cuda12x.*cupy-cuda13x"):
        load_cupy()
    with pytest.raises(ShmUnavailable, match="cupy-cuda12x"):
        CudaSlot("gw_1", REGION_BYTES, device_id=0)


def write_cupy(path: Path, body: str) -> None:
    package = path / "cupy"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(body))


@pytest.fixture
def fresh_cupy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A directory ahead of everything on sys.path, for a ``cupy`` package the test writes."""
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("cupy", None)


def test_a_warning_while_importing_cupy_cannot_fail_the_start(
    fresh_cupy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # cuda-python 12.6.1-12.9 warned like this on `from cuda import cudart`; the suite runs with
    # filterwarnings = error, so an unguarded import would fail here.
    write_cupy(
        fresh_cupy,
        """
        import types, warnings
        warnings.warn("this module is deprecated", FutureWarning)
        cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
        """,
    )
    with caplog.at_level("INFO", logger="gateway.triton.shm.slots"):
        module = load_cupy()
    assert module.cuda.runtime.getDeviceCount() == 1
    assert "FutureWarning: this module is deprecated" in caplog.text


def test_cupy_without_a_usable_gpu_is_shm_unavailable(fresh_cupy: Path) -> None:
    write_cupy(
        fresh_cupy,
        """
        import types
        def count():
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
        cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=count))
        """,
    )
    with pytest.raises(ShmUnavailable, match=r"CUDA is not usable here.*cudaErrorNoDevice"):
        load_cupy()


def test_cupy_that_sees_no_gpu_is_shm_unavailable(fresh_cupy: Path) -> None:
    write_cupy(
        fresh_cupy,
        """
        import types
        cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 0))
        """,
    )
    with pytest.raises(ShmUnavailable, match="CUDA reports none"):
        load_cupy()
