"""The one place errors become responses: every failure leaves as ``{"error": {...}}``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import errors
from gateway.context import request_id_var
from gateway.responses import OrjsonResponse

# Framework refusals -> the gateway's errors (anything else keeps its status as HttpError).
HTTP_STATUS_TO_ERROR: dict[int, type[errors.GatewayError]] = {
    400: errors.BadRequest,
    404: errors.NotFound,
    405: errors.MethodNotAllowed,
    413: errors.PayloadTooLarge,
}


def error_response(error: errors.GatewayError) -> Response:
    """The JSON error response for ``error``: its status, code, message, headers, request id."""
    return OrjsonResponse(
        {
            "error": {
                "code": error.code,
                "message": error.message,
                "request_id": request_id_var.get(),
            }
        },
        status_code=error.status_code,
        headers=error.headers,
    )


def _from_http_exception(request: Request, exc: StarletteHTTPException) -> errors.GatewayError:
    # The framework's headers are protocol, not decoration: every 405 it raises carries `Allow`
    # (routes and static files alike), which RFC 9110 requires of a 405 answer.
    headers = dict(exc.headers or {})
    message = str(exc.detail)
    if exc.status_code == 405 and "Allow" in headers:
        message = f"{request.method} is not allowed here; allowed: {headers['Allow']}"
    error_class = HTTP_STATUS_TO_ERROR.get(exc.status_code)
    if error_class is not None:
        return error_class(message, headers)
    return errors.HttpError(message, exc.status_code, headers)


def _from_validation_error(exc: RequestValidationError) -> errors.GatewayError:
    problems = []
    for item in exc.errors():
        if item.get("type") == "json_invalid":
            return errors.BadRequest("the body is not valid JSON")
        location = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        problems.append(f"{location or 'body'}: {item.get('msg')}")
    return errors.InvalidRequest("; ".join(problems[:10]))


def install_error_handlers(app: FastAPI) -> None:
    """Route every expected exception through :func:`error_response`.

    Unexpected exceptions are answered by the request-context middleware (inside the request's
    context, so with its request id) through the same function.
    """

    async def gateway_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.GatewayError)
        return error_response(exc)

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(_from_validation_error(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(_from_http_exception(request, exc))

    app.add_exception_handler(errors.GatewayError, gateway_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
