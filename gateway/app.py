"""The app factory: ``create_app(settings, client=...)`` wires settings, metrics, auth, routes,
the error handlers and the OpenAPI document; the lifespan starts the service and closes it.

Nothing connects until the lifespan starts. A Triton client can be injected (the unit tests pass
a fake one); otherwise the lifespan creates the real gRPC client inside the running event loop.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from gateway.api_docs import install_api_docs
from gateway.auth import KeyRing
from gateway.error_handlers import install_error_handlers
from gateway.metrics import GatewayMetrics, instrument
from gateway.middleware import RequestContextMiddleware
from gateway.openapi import API_DESCRIPTION, install_openapi
from gateway.rate_limit import RateLimiter
from gateway.responses import OrjsonResponse
from gateway.routes import router
from gateway.service import InferenceService
from gateway.settings import Settings
from gateway.triton.api import TritonApi

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, client: TritonApi | None = None) -> FastAPI:
    """Build the gateway app (``client``: a Triton client to use instead of the real one)."""
    settings = settings or Settings()
    metrics = GatewayMetrics(CollectorRegistry())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from gateway.triton.client import TritonClient

        service = InferenceService(
            client or TritonClient(settings, metrics),
            settings,
            metrics,
            callers=app.state.keyring.digests("infer"),
        )
        app.state.service = service
        service.start()
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
            await service.close()
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
    app.state.rate_limiter = RateLimiter(settings.default_rate_limit_policy, metrics)
    install_error_handlers(app)
    instrument(app, metrics.registry)
    app.include_router(router)
    install_api_docs(app)
    app.add_middleware(
        RequestContextMiddleware, max_body_bytes=settings.max_body_bytes, metrics=metrics
    )
    install_openapi(app)
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (several workers): settings from the environment."""
    from gateway.logs import configure_logging

    settings = Settings()
    configure_logging(settings.log_level)
    return create_app(settings)
