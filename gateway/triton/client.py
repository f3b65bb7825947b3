"""The gateway's one connection to Triton: a ``tritonclient.grpc.aio`` client and its transport.

The client owns, from construction, how tensors travel (in the gRPC messages, or through a
shared-memory pool when the settings ask for one). Failures are classified by gRPC status code
(``gateway/triton/status.py``). It satisfies :class:`gateway.triton.api.TritonApi`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TypeVar

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from gateway import errors
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.triton.api import InferOutcome, ModelInfo, RepositoryEntry
from gateway.triton.codecs import TEXT_INPUT, serialize_bytes, text_input
from gateway.triton.shm import FLOAT32_BYTES, Lease, SharedMemoryManager
from gateway.triton.status import UNFINISHED_STATUSES, grpc_status, map_triton_error

T = TypeVar("T")

# Reconnect quickly after Triton restarts (gRPC's default backoff grows to 120 s).
CHANNEL_ARGS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


def triton_timeout_us(timeout_s: float | None) -> int | None:
    """The request's deadline for Triton itself, in whole microseconds (at least 1).

    ``client_timeout`` only ends the wait on this side; with this per-request timeout (and the
    models' queue policy ``timeout_action: REJECT``), Triton drops a request whose caller has given
    up before executing it.
    """
    return None if timeout_s is None else max(1, int(timeout_s * 1_000_000))


class TritonClient:
    """Async gRPC client for the gateway's models (one per process; create it inside the loop)."""

    def __init__(self, settings: Settings, metrics: GatewayMetrics) -> None:
        self.url = settings.triton_grpc_url
        self.retry_after_s = settings.retry_after_s
        self._client = grpcclient.InferenceServerClient(self.url, channel_args=CHANNEL_ARGS)
        self._shm = SharedMemoryManager.from_settings(self._client, settings, metrics)

    @property
    def shm(self) -> SharedMemoryManager | None:
        """The shared-memory pool's manager, when the transport uses one."""
        return self._shm

    async def connect(self) -> None:
        """After every (re)connection: (re)register the shared-memory pool, if there is one."""
        if self._shm is not None:
            await self._shm.connect()

    async def close(self) -> None:
        """Unregister and free the shared-memory pool, then close the channel."""
        if self._shm is not None:
            await self._shm.close()
        await self._client.close()

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except InferenceServerException as exc:
            raise map_triton_error(exc, self.retry_after_s) from exc

    async def is_ready(self, models: Sequence[str], timeout_s: float) -> tuple[bool, str]:
        """Whether Triton is live and every one of ``models`` is ready, with a reason."""
        try:
            if not await self._client.is_server_live(client_timeout=timeout_s):
                return False, "Triton is not live"
            # Not is_server_ready: with --strict-readiness it is false while any model loads or
            # after one is unloaded, which a rollout does while the routed models serve.
            for model in models:
                if not await self._client.is_model_ready(model, client_timeout=timeout_s):
                    return False, f"model {model} is not ready"
        except InferenceServerException as exc:
            return False, f"Triton unreachable at {self.url}: {grpc_status(exc) or exc}"
        return True, "ok"

    async def model_info(self, model: str, timeout_s: float) -> ModelInfo:
        """``model``'s batch limit and the per-text size of its fixed-shape FP32 outputs."""
        answer = await self._call(self._client.get_model_config(model, client_timeout=timeout_s))
        elements = {}
        for output in answer.config.output:
            dims = [int(d) for d in output.dims]
            if output.data_type == model_config_pb2.TYPE_FP32 and dims and all(d > 0 for d in dims):
                elements[output.name] = int(np.prod(dims))
        config = answer.config
        return ModelInfo(
            model,
            int(config.max_batch_size),
            elements,
            parameters={key: value.string_value for key, value in config.parameters.items()},
            composing_models=tuple(step.model_name for step in config.ensemble_scheduling.step),
        )

    async def repository_index(self, timeout_s: float) -> list[RepositoryEntry]:
        """Every model in Triton's repository: name, version, state, reason."""
        answer = await self._call(self._client.get_model_repository_index(client_timeout=timeout_s))
        return [RepositoryEntry(m.name, m.version, m.state, m.reason) for m in answer.models]

    async def load_model(self, model: str, timeout_s: float) -> None:
        """Load ``model`` (an ensemble: with its composing models) from the repository."""
        await self._call(self._client.load_model(model, client_timeout=timeout_s))

    async def unload_model(self, model: str, timeout_s: float) -> None:
        """Unload ``model`` alone (never its composing models: another ensemble may share them)."""
        await self._call(
            self._client.unload_model(model, unload_dependents=False, client_timeout=timeout_s)
        )

    async def infer_texts(
        self,
        model: ModelInfo,
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
        elements = model.output_elements.get(output)
        if self._shm is not None and elements is not None:
            payload = serialize_bytes(texts)
            lease = await self._shm.acquire(len(payload), len(texts) * elements * FLOAT32_BYTES)
            if lease is not None:
                return await self._infer_shm(
                    self._shm, lease, payload, model.name, texts, output, model_version,
                    timeout_s, request_id,
                )  # fmt: skip
        result = await self._call(
            self._client.infer(
                model.name,
                [text_input(texts)],
                model_version=model_version,
                outputs=[grpcclient.InferRequestedOutput(output)],
                request_id=request_id,
                timeout=triton_timeout_us(timeout_s),
                client_timeout=timeout_s,
            )
        )
        array = result.as_numpy(output)
        if array is None or len(array) != len(texts):
            raise errors.UpstreamError(f"Triton returned no complete '{output}' tensor")
        return InferOutcome(array, result.get_response().model_version)

    async def _infer_shm(
        self,
        shm: SharedMemoryManager,
        lease: Lease,
        payload: bytes,
        model: str,
        texts: Sequence[str],
        output: str,
        model_version: str,
        timeout_s: float | None,
        request_id: str,
    ) -> InferOutcome:
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
                        timeout=triton_timeout_us(timeout_s),
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
                or int(np.prod(shape)) * FLOAT32_BYTES > lease.output.byte_size
            ):
                raise errors.UpstreamError(f"Triton returned no complete '{output}' tensor")
            array = lease.slot.read_float32(lease.output, shape)
            return InferOutcome(array, result.get_response().model_version, lease.transport)
        finally:
            shm.release(lease, finished)
