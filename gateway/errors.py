"""The gateway's error hierarchy: every error carries its HTTP status and a stable code.

One function (``gateway/error_handlers.py``) turns any of them into
``{"error": {"code", "message", "request_id"}}``, and the OpenAPI document's error responses are
generated from the classes a route can raise (``gateway/openapi.py``). Triton failures are
classified by gRPC status code (``gateway/triton/status.py``), never by text.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error the API reports; subclasses fix ``status_code`` and ``code``."""

    status_code = 500
    code = "internal_error"
    # Response headers this error always carries, with their meaning (for the OpenAPI document).
    response_headers: dict[str, str] = {}

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        # The gRPC status name when the error came from Triton (for metrics), else None.
        self.upstream_status: str | None = None


class InternalError(GatewayError):
    """An unexpected failure in the gateway; its log has the details under the request id."""


class BadRequest(GatewayError):
    """The body is not parseable (invalid JSON or UTF-8)."""

    status_code = 400
    code = "bad_request"


class Unauthorized(GatewayError):
    """No API key, or an unknown one."""

    status_code = 401
    code = "unauthorized"
    response_headers = {"WWW-Authenticate": "The authentication scheme to use (Bearer)"}

    def __init__(self, message: str) -> None:
        super().__init__(message, {"WWW-Authenticate": 'Bearer realm="textscore"'})


class Forbidden(GatewayError):
    """A valid key without the scope the route needs."""

    status_code = 403
    code = "forbidden"


class NotFound(GatewayError):
    """No such route or resource."""

    status_code = 404
    code = "not_found"


class MethodNotAllowed(GatewayError):
    """The route exists, the method does not; ``Allow`` lists the methods it has."""

    status_code = 405
    code = "method_not_allowed"
    response_headers = {"Allow": "The methods the path supports"}


class PayloadTooLarge(GatewayError):
    """The body exceeds the configured size limit (``max_body_bytes``)."""

    status_code = 413
    code = "payload_too_large"


class InvalidRequest(GatewayError):
    """The body parsed but breaks the schema or a limit."""

    status_code = 422
    code = "invalid_request"


class ServiceUnavailable(GatewayError):
    """Temporarily unable to serve; the caller should retry after ``Retry-After`` seconds."""

    status_code = 503
    code = "service_unavailable"
    response_headers = {"Retry-After": "Seconds to wait before retrying"}

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})


class NotReady(ServiceUnavailable):
    """Not ready: warming Triton up, or lost it; retry after ``Retry-After`` seconds."""

    code = "not_ready"


class Overloaded(ServiceUnavailable):
    """Refused at once by admission control: the model's queue would not drain in time for this
    request; retry after ``Retry-After`` seconds."""

    code = "overloaded"


class RateLimited(GatewayError):
    """This API key sent more requests than its rate limit allows; retry after ``Retry-After``."""

    status_code = 429
    code = "rate_limited"
    response_headers = {
        "Retry-After": "Seconds until the key may send again",
        "RateLimit": "The key's remaining quota and seconds until it is full (r, t)",
        "RateLimit-Policy": "The key's quota and its window (q, w)",
    }


class UpstreamUnavailable(ServiceUnavailable):
    """Triton answered UNAVAILABLE or could not be reached; retry after ``Retry-After`` seconds."""

    code = "upstream_unavailable"


class UpstreamTimeout(GatewayError):
    """The request's deadline passed before Triton answered."""

    status_code = 504
    code = "upstream_timeout"


class UpstreamInvalidArgument(GatewayError):
    """Triton rejected the request's content (INVALID_ARGUMENT)."""

    status_code = 422
    code = "upstream_invalid_argument"


class ModelNotFound(GatewayError):
    """Triton has no such model or version (NOT_FOUND)."""

    status_code = 404
    code = "model_not_found"


class Conflict(GatewayError):
    """The request contradicts the current state (e.g. unloading a version that serves traffic)."""

    status_code = 409
    code = "conflict"


class HttpError(GatewayError):
    """Any other HTTP-level refusal by the framework, with its own status (and headers)."""

    code = "http_error"

    def __init__(
        self, message: str, status_code: int, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, headers)
        self.status_code = status_code


class UpstreamError(GatewayError):
    """Any other Triton failure: reported as a bad gateway, never a bare 500."""

    status_code = 502
    code = "upstream_error"


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer: its work was cancelled, nothing is sent.

    Not a :class:`GatewayError`: there is nobody to answer. The request-context middleware logs
    it as an ordinary event, not as a failure.
    """
