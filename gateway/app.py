"""The app factory: ``create_app(settings)`` wires settings, Triton client, service, health,
metrics, auth and the single error handler; the lifespan opens and closes the Triton client.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import errors
from gateway.api_docs import install_api_docs
from gateway.auth import KeyRing
from gateway.context import request_id_var
from gateway.deps import authenticate
from gateway.health import ReadinessMonitor
from gateway.health import router as health_router
from gateway.metrics import GatewayMetrics, instrument
from gateway.middleware import RequestContextMiddleware
from gateway.responses import OrjsonResponse
from gateway.routes import router as api_router
from gateway.service import InferenceService
from gateway.settings import Settings
from gateway.triton.client import TritonClient
from gateway.triton.shm import SharedMemoryManager

log = logging.getLogger(__name__)

API_DESCRIPTION = """
Scores texts with a BERT encoder and a random-forest regressor served by NVIDIA Triton.

Authenticate with `Authorization: Bearer <key>` or `X-API-Key: <key>`. Every error has the shape
`{"error": {"code", "message", "request_id"}}`. Send `X-Request-ID` to correlate logs; send
`X-Request-Timeout` (seconds) to shorten the deadline.
"""


def _error_response(error: errors.GatewayError) -> Response:
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


def _http_error(exc: StarletteHTTPException) -> errors.GatewayError:
    by_status: dict[int, type[errors.GatewayError]] = {
        400: errors.BadRequest,
        404: errors.NotFound,
        405: errors.MethodNotAllowed,
        413: errors.PayloadTooLarge,
    }
    error_class = by_status.get(exc.status_code)
    if error_class is not None:
        return error_class(str(exc.detail))
    generic = errors.GatewayError(str(exc.detail))
    generic.status_code = exc.status_code
    generic.code = "http_error"
    return generic


def _validation_message(exc: RequestValidationError) -> errors.GatewayError:
    problems = []
    for item in exc.errors():
        if item.get("type") == "json_invalid":
            return errors.BadRequest("the body is not valid JSON")
        location = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        problems.append(f"{location or 'body'}: {item.get('msg')}")
    return errors.InvalidRequest("; ".join(problems[:10]))


def install_error_handlers(app: FastAPI) -> None:
    """Every failure leaves as the one JSON error shape with its status code."""

    async def gateway_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.GatewayError)
        return _error_response(exc)

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _error_response(_validation_message(exc))

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return _error_response(_http_error(exc))

    async def unexpected_error(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return _error_response(
            errors.GatewayError("internal error; see the gateway log for this request id")
        )

    app.add_exception_handler(errors.GatewayError, gateway_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)


def create_app(settings: Settings | None = None, connect_hooks: list[Any] | None = None) -> FastAPI:
    """Build the gateway app; nothing connects until the lifespan starts."""
    settings = settings or Settings()
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = TritonClient(settings.triton_grpc_url, settings.retry_after_s)
        shm = SharedMemoryManager.from_settings(client.grpc, settings, metrics)
        client.shm = shm
        # Shared memory is (re)registered after every (re)connection, before the warm-up.
        hooks = ([shm.connect] if shm is not None else []) + list(connect_hooks or [])
        monitor = ReadinessMonitor(client, settings, metrics, hooks)
        app.state.monitor = monitor
        app.state.service = InferenceService(client, settings, metrics, monitor)
        monitor.start()
        log.info(
            "gateway started",
            extra={
                "triton": settings.triton_grpc_url,
                "keys": len(app.state.keyring),
                "transport": settings.transport,
            },
        )
        try:
            yield
        finally:
            await monitor.stop()
            if shm is not None:
                await shm.close()
            await client.close()
            log.info("gateway stopped")

    app = FastAPI(
        title="textscore gateway",
        version="1.0.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        default_response_class=OrjsonResponse,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.keyring = KeyRing(settings.key_entries)
    install_error_handlers(app)
    instrument(app, registry)
    app.include_router(health_router)
    app.include_router(api_router)
    install_api_docs(app)

    async def metrics_endpoint(request: Request) -> Response:
        if settings.protect_metrics:
            authenticate(request)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route(
        "/metrics",
        metrics_endpoint,
        methods=["GET"],
        operation_id="metrics",
        summary="Prometheus metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
    )
    app.add_middleware(
        RequestContextMiddleware, max_body_bytes=settings.max_body_bytes, metrics=metrics
    )
    _add_security_schemes(app)
    return app


def _add_security_schemes(app: FastAPI) -> None:
    """Declare both API-key forms in OpenAPI so generated SDKs send them."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        schema.setdefault("components", {})["securitySchemes"] = {
            "BearerAuth": {
                "type": "http",
                "scheme": "bearer",
                "description": "Authorization: Bearer <key>",
            },
            "ApiKeyAuth": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
        error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                # FastAPI documents its own validation shape; ours replaces it everywhere.
                invalid = operation.get("responses", {}).get("422")
                if invalid is not None:
                    invalid["content"] = {"application/json": {"schema": error_ref}}
                # /metrics is open by default (GATEWAY_PROTECT_METRICS closes it); one document.
                if path.startswith("/v1/"):
                    operation["security"] = [{"BearerAuth": []}, {"ApiKeyAuth": []}]
        for unused in ("HTTPValidationError", "ValidationError"):
            schema["components"].get("schemas", {}).pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (several workers): settings from the environment."""
    from gateway.logs import configure_logging

    settings = Settings()
    configure_logging(settings.log_level)
    return create_app(settings)
