"""Triton failures become gateway errors by gRPC status code (the explicit table), never by text."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from gateway import errors
from gateway.triton.status import map_triton_error


@pytest.mark.parametrize(
    ("status", "error_class", "http_status"),
    [
        ("StatusCode.UNAVAILABLE", errors.UpstreamUnavailable, 503),
        ("StatusCode.DEADLINE_EXCEEDED", errors.UpstreamTimeout, 504),
        ("StatusCode.INVALID_ARGUMENT", errors.UpstreamInvalidArgument, 422),
        ("StatusCode.NOT_FOUND", errors.ModelNotFound, 404),
        ("StatusCode.INTERNAL", errors.UpstreamError, 502),
        ("StatusCode.RESOURCE_EXHAUSTED", errors.UpstreamError, 502),
        (None, errors.UpstreamError, 502),
    ],
)
def test_status_codes_map_to_http_statuses(
    status: str | None, error_class: type[errors.GatewayError], http_status: int
) -> None:
    # The message deliberately names another failure: only the status code may decide.
    failure = InferenceServerException("Deadline Exceeded: model not found", status=status)
    error = map_triton_error(failure, retry_after_s=3)
    assert type(error) is error_class
    assert error.status_code == http_status
    assert error.upstream_status == (status.removeprefix("StatusCode.") if status else "UNKNOWN")
    if http_status == 503:
        assert error.headers == {"Retry-After": "3"}
    assert "Traceback" not in error.message
