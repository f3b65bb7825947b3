"""The gateway's one connection to Triton: a ``tritonclient.grpc.aio`` client and error mapping.

Failures are classified by their gRPC status code (never by message text) into the gateway's
error hierarchy, following an explicit table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from gateway import errors
from gateway.triton.codecs import TEXT_INPUT, serialize_bytes, text_input
from gateway.triton.shm import FLOAT32_BYTES, Lease, SharedMemoryManager

log = logging.getLogger(__name__)

# gRPC status -> what the API reports. Anything not listed is an upstream error (502).
STATUS_TO_ERROR: dict[grpc.StatusCode, type[errors.GatewayError]] = {
    grpc.StatusCode.UNAVAILABLE: errors.UpstreamUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.UpstreamTimeout,
    grpc.StatusCode.INVALID_ARGUMENT: errors.UpstreamInvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.ModelNotFound,
}

# Statuses the client side produces while Triton may still be running the request (and writing
# its output into a shared-memory region): the region must not be reused after them.
UNFINISHED_STATUSES = {"DEADLINE_EXCEEDED", "CANCELLED", "UNAVAILABLE", "UNKNOWN", None}

# Reconnect quickly after Triton restarts (gRPC's default backoff grows to 120 s).
CHANNEL_ARGS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


def grpc_status(exc: InferenceServerException) -> grpc.StatusCode | None:
    """The gRPC status code an InferenceServerException carries (``"StatusCode.X"``), if any."""
    status = exc.status() or ""
    name = status.removeprefix("StatusCode.")
    return grpc.StatusCode.__members__.get(name)


def map_triton_error(exc: InferenceServerException, retry_after_s: int) -> errors.GatewayError:
    """Translate a Triton failure into the gateway error its gRPC status code calls for."""
    status = grpc_status(exc)
    error_class = STATUS_TO_ERROR.get(status) if status is not None else None
    message = f"Triton: {exc.message() or exc}"
    error: errors.GatewayError
    if error_class is None:
        error = errors.UpstreamError(message)
    elif issubclass(error_class, errors.ServiceUnavailable):
        error = error_class(message, retry_after_s)
    else:
        error = error_class(message)
    error.upstream_status = status.name if status is not None else "UNKNOWN"
    return error


@dataclass(frozen=True)
class InferOutcome:
    """One output tensor of a Triton response and the model version that produced it."""

    array: npt.NDArray[np.float32]
    model_version: str
    transport: str = "grpc"


class TritonClient:
    """Async gRPC client for the gateway's models (one per process)."""

    def __init__(self, url: str, retry_after_s: int = 1) -> None:
        self.url = url
        self.retry_after_s = retry_after_s
        self._client = grpcclient.InferenceServerClient(url, channel_args=CHANNEL_ARGS)
        # FP32 elements per text of each (model, output), from the model config: the size of an
        # output placed in shared memory must be known before the request.
        self.output_elements: dict[tuple[str, str], int] = {}
        self.shm: SharedMemoryManager | None = None

    @property
    def grpc(self) -> Any:
        """The underlying ``tritonclient.grpc.aio`` client (for the shared-memory manager)."""
        return self._client

    async def close(self) -> None:
        """Close the channel."""
        await self._client.close()

    async def _call(self, coroutine: Any) -> Any:
        try:
            return await coroutine
        except InferenceServerException as exc:
            raise map_triton_error(exc, self.retry_after_s) from exc

    async def is_ready(self, models: Sequence[str], timeout_s: float) -> tuple[bool, str]:
        """Whether Triton is live and ready and every one of ``models`` is ready, with a reason."""
        try:
            if not await self._client.is_server_live(client_timeout=timeout_s):
                return False, "Triton is not live"
            if not await self._client.is_server_ready(client_timeout=timeout_s):
                return False, "Triton is not ready"
            for model in models:
                if not await self._client.is_model_ready(model, client_timeout=timeout_s):
                    return False, f"model {model} is not ready"
        except InferenceServerException as exc:
            return False, f"Triton unreachable at {self.url}: {grpc_status(exc) or exc}"
        return True, "ok"

    async def read_model_config(self, model: str, timeout_s: float) -> int:
        """Read the model's configuration from Triton; return its ``max_batch_size``.

        Also remembers the per-text size of its fixed-shape FP32 outputs (``output_elements``).
        """
        answer = await self._call(self._client.get_model_config(model, client_timeout=timeout_s))
        for output in answer.config.output:
            dims = [int(d) for d in output.dims]
            if output.data_type == model_config_pb2.TYPE_FP32 and dims and all(d > 0 for d in dims):
                self.output_elements[(model, output.name)] = int(np.prod(dims))
        return int(answer.config.max_batch_size)

    async def repository_index(self, timeout_s: float) -> list[dict[str, str]]:
        """Every model in Triton's repository: name, version, state, reason."""
        answer = await self._call(self._client.get_model_repository_index(client_timeout=timeout_s))
        return [
            {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
            for m in answer.models
        ]

    async def infer_texts(
        self,
        model: str,
        texts: Sequence[str],
        output: str,
        model_version: str = "",
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> InferOutcome:
        """Send ``texts`` to ``model`` and return its ``output`` tensor (cancellable).

        Uses a shared-memory slot when the configured transport picks one for this payload, else
        carries the tensors in the gRPC messages.
        """
        elements = self.output_elements.get((model, output))
        if self.shm is not None and elements is not None:
            payload = serialize_bytes(texts)
            lease = await self.shm.acquire(len(payload), len(texts) * elements * FLOAT32_BYTES)
            if lease is not None:
                return await self._infer_shm(
                    lease, payload, model, texts, output, model_version, timeout_s, request_id
                )
        result = await self._call(
            self._client.infer(
                model,
                [text_input(texts)],
                model_version=model_version,
                outputs=[grpcclient.InferRequestedOutput(output)],
                request_id=request_id,
                client_timeout=timeout_s,
            )
        )
        array = result.as_numpy(output)
        if array is None or len(array) != len(texts):
            raise errors.UpstreamError(f"Triton returned no complete '{output}' tensor")
        return InferOutcome(array, result.get_response().model_version)

    async def _infer_shm(
        self,
        lease: Lease,
        payload: bytes,
        model: str,
        texts: Sequence[str],
        output: str,
        model_version: str,
        timeout_s: float | None,
        request_id: str,
    ) -> InferOutcome:
        assert self.shm is not None
        # Until Triton has answered, it may write into the slot: released only in the finally,
        # and as "finished" only once a response (or a server-side error status) came back.
        finished = False
        try:
            lease.slot.write(lease.input, payload)
            tensor = grpcclient.InferInput(TEXT_INPUT, [len(texts), 1], "BYTES")
            tensor.set_shared_memory(lease.input.region, lease.input.byte_size, lease.input.offset)
            requested = grpcclient.InferRequestedOutput(output)
            requested.set_shared_memory(
                lease.output.region, lease.output.byte_size, lease.output.offset
            )
            try:
                result = await self._call(
                    self._client.infer(
                        model,
                        [tensor],
                        model_version=model_version,
                        outputs=[requested],
                        request_id=request_id,
                        client_timeout=timeout_s,
                    )
                )
            except errors.GatewayError as exc:
                finished = exc.upstream_status not in UNFINISHED_STATUSES
                raise
            finished = True
            # as_numpy() cannot read an output placed in shared memory: read the slot.
            shape = [int(d) for d in result.get_output(output).shape]
            if (
                not shape
                or shape[0] != len(texts)
                or int(np.prod(shape)) * FLOAT32_BYTES > (lease.output.byte_size)
            ):
                raise errors.UpstreamError(f"Triton returned no complete '{output}' tensor")
            array = lease.slot.read_float32(lease.output, shape)
            return InferOutcome(array, result.get_response().model_version, lease.transport)
        finally:
            self.shm.release(lease, finished)
