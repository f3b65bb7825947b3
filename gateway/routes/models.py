"""``GET /v1/models``: what Triton serves and which models the gateway routes to."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from gateway import errors
from gateway.deps import InferencePrincipal, ServiceDep
from gateway.openapi import AUTH_ERRORS, error_responses
from gateway.schemas import ModelsResponse

router = APIRouter(prefix="/v1")


@router.get(
    "/models",
    operation_id="listModels",
    summary="Models served by Triton and the gateway's routes",
    tags=["models"],
    response_model=ModelsResponse,
    responses=error_responses(
        *AUTH_ERRORS,
        errors.RateLimited,
        errors.UpstreamUnavailable,
        errors.UpstreamError,
        errors.UpstreamTimeout,
        errors.InternalError,
    ),
)
async def list_models(service: ServiceDep, _: InferencePrincipal) -> ModelsResponse:
    """Every model version in Triton's repository with its state."""
    entries = await service.repository()
    return ModelsResponse.model_validate(
        {"routes": service.routes, "models": [asdict(entry) for entry in entries]}
    )
