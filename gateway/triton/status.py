"""Triton failures -> gateway errors, by gRPC status code (an explicit table), never by text."""

from __future__ import annotations

import grpc
from tritonclient.utils import InferenceServerException

from gateway import errors

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
