"""The v1 API. Routes only translate HTTP to service calls and back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.deps import (
    REQUEST_TIMEOUT_PARAMETER,
    InferenceContextDep,
    InferencePrincipal,
    ServiceDep,
    SettingsDep,
)
from gateway.responses import OrjsonResponse
from gateway.schemas import (
    EmbedRequest,
    EmbedResponse,
    ErrorResponse,
    ModelsResponse,
    PredictRequest,
    PredictResponse,
)

T = TypeVar("T")


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _error("Missing or invalid API key"),
    403: _error("The API key lacks the required scope"),
    503: _error("Not ready or Triton unavailable; retry after Retry-After seconds"),
}
INFERENCE_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_ERRORS,
    400: _error("Body is not valid JSON or not valid UTF-8"),
    404: _error("Model or model version not found"),
    413: _error("Body larger than the configured limit"),
    422: _error("Body breaks the schema or a limit, or Triton rejected its content"),
    502: _error("Triton failed in an unexpected way"),
    504: _error("The request's deadline passed before Triton answered"),
}

router = APIRouter(prefix="/v1")


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (and so its Triton calls) if the HTTP client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise asyncio.CancelledError("client disconnected")
        return task.result()
    finally:
        watcher.cancel()
        task.cancel()


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read already, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@router.post(
    "/predict",
    operation_id="predict",
    summary="Score texts",
    tags=["inference"],
    response_model=PredictResponse,
    responses=INFERENCE_ERRORS,
    openapi_extra={"parameters": [REQUEST_TIMEOUT_PARAMETER]},
)
async def predict(body: PredictRequest, request: Request, context: InferenceContextDep) -> Response:
    """Run the texts through the text-regression ensemble; one score per text, in order."""
    result = await until_disconnected(
        request,
        context.service.predict(
            body.texts, body.model_version, context.timeout_s, context.request_id
        ),
    )
    return OrjsonResponse(
        {
            "model_name": result.model_name,
            "model_version": result.model_version,
            "scores": result.values,
            "request_id": context.request_id,
        }
    )


@router.post(
    "/embed",
    operation_id="embed",
    summary="Embed texts",
    tags=["inference"],
    response_model=EmbedResponse,
    responses=INFERENCE_ERRORS,
    openapi_extra={"parameters": [REQUEST_TIMEOUT_PARAMETER]},
)
async def embed(body: EmbedRequest, request: Request, context: InferenceContextDep) -> Response:
    """Run the texts through the text-embedding ensemble; one L2-normalised vector per text."""
    result = await until_disconnected(
        request,
        context.service.embed(
            body.texts, body.model_version, context.timeout_s, context.request_id
        ),
    )
    return OrjsonResponse(
        {
            "model_name": result.model_name,
            "model_version": result.model_version,
            "dimension": int(result.values.shape[1]),
            "embeddings": result.values,
            "request_id": context.request_id,
        }
    )


@router.get(
    "/models",
    operation_id="listModels",
    summary="Models served by Triton and the gateway's routes",
    tags=["models"],
    response_model=ModelsResponse,
    responses={**COMMON_ERRORS, 502: _error("Triton failed"), 504: _error("Triton did not answer")},
)
async def list_models(
    service: ServiceDep, settings: SettingsDep, _: InferencePrincipal
) -> ModelsResponse:
    """Every model version in Triton's repository with its state."""
    models = await service.client.repository_index(settings.request_timeout_s)
    return ModelsResponse.model_validate(
        {
            "routes": {
                "/v1/predict": settings.regression_model,
                "/v1/embed": settings.embedding_model,
            },
            "models": models,
        }
    )
