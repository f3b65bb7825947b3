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
from tritonclient.utils import InferenceServerException

from gateway import errors
from gateway.triton.codecs import text_input

log = logging.getLogger(__name__)

# gRPC status -> what the API reports. Anything not listed is an upstream error (502).
STATUS_TO_ERROR: dict[grpc.StatusCode, type[errors.GatewayError]] = {
    grpc.StatusCode.UNAVAILABLE: errors.UpstreamUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.UpstreamTimeout,
    grpc.StatusCode.INVALID_ARGUMENT: errors.UpstreamInvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.ModelNotFound,
}

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


class TritonClient:
    """Async gRPC client for the gateway's models (one per process)."""

    def __init__(self, url: str, retry_after_s: int = 1) -> None:
        self.url = url
        self.retry_after_s = retry_after_s
        self._client = grpcclient.InferenceServerClient(url, channel_args=CHANNEL_ARGS)

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

    async def max_batch_size(self, model: str, timeout_s: float) -> int:
        """The model's ``max_batch_size`` from its configuration in Triton."""
        answer = await self._call(self._client.get_model_config(model, client_timeout=timeout_s))
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
        """Send ``texts`` to ``model`` and return its ``output`` tensor (cancellable)."""
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
