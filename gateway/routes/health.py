"""``/livez`` and ``/readyz``: open routes for orchestrators."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from gateway.deps import ServiceDep
from gateway.responses import OrjsonResponse
from gateway.schemas import HealthResponse

router = APIRouter(tags=["health"])


@router.get(
    "/livez",
    operation_id="livez",
    summary="Liveness: 200 while the process runs",
    response_model=HealthResponse,
)
async def livez() -> Response:
    """Always 200 while the process serves requests."""
    return OrjsonResponse({"status": "alive", "reason": None})


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="Readiness: 200 only when Triton, the models and the warm-up are all good",
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse, "description": "Not ready, with the reason"}},
)
async def readyz(service: ServiceDep) -> Response:
    """200 when ready to take traffic, else 503 with the reason and ``Retry-After``."""
    state = service.readiness
    if state.ready:
        return OrjsonResponse({"status": "ready", "reason": None})
    return OrjsonResponse(
        {"status": "not_ready", "reason": state.reason},
        status_code=503,
        headers={"Retry-After": str(service.settings.retry_after_s)},
    )
