"""``/metrics``: the app's Prometheus registry (open unless ``GATEWAY_PROTECT_METRICS``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.deps import authenticate
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    operation_id="metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
async def metrics(request: Request) -> Response:
    """The gateway's series in the Prometheus text format."""
    settings: Settings = request.app.state.settings
    if settings.protect_metrics:
        authenticate(request)
    gateway_metrics: GatewayMetrics = request.app.state.metrics
    return Response(generate_latest(gateway_metrics.registry), media_type=CONTENT_TYPE_LATEST)
