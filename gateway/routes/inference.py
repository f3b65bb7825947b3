"""``POST /v1/predict`` and ``POST /v1/embed``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway import errors
from gateway.deps import REQUEST_TIMEOUT_PARAMETER, InferenceContext, InferenceContextDep
from gateway.openapi import AUTH_ERRORS, error_responses
from gateway.responses import OrjsonResponse
from gateway.schemas import EmbedRequest, EmbedResponse, PredictRequest, PredictResponse
from gateway.service import ModelResult

T = TypeVar("T")

INFERENCE_ERRORS = error_responses(
    *AUTH_ERRORS,
    errors.RateLimited,
    errors.Overloaded,
    errors.BadRequest,
    errors.ModelNotFound,
    errors.PayloadTooLarge,
    errors.InvalidRequest,
    errors.UpstreamInvalidArgument,
    errors.NotReady,
    errors.UpstreamUnavailable,
    errors.UpstreamError,
    errors.UpstreamTimeout,
    errors.InternalError,
)

router = APIRouter(prefix="/v1", tags=["inference"])


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (and so its Triton calls) if the HTTP client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise errors.ClientDisconnected()
        return task.result()
    finally:
        watcher.cancel()
        task.cancel()


def answer(context: InferenceContext, result: ModelResult, **outputs: object) -> Response:
    """The JSON answer of an inference route: which model version answered, ``outputs``, the
    request id, and the caller's rate-limit headers."""
    return OrjsonResponse(
        {
            "model_name": result.model_name,
            "model_version": result.model_version,
            **outputs,
            "request_id": context.request_id,
        },
        headers=context.headers,
    )


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
    response_model=PredictResponse,
    responses=INFERENCE_ERRORS,
    openapi_extra={"parameters": [REQUEST_TIMEOUT_PARAMETER]},
)
async def predict(body: PredictRequest, request: Request, context: InferenceContextDep) -> Response:
    """Run the texts through the text-regression ensemble; one score per text, in order."""
    result = await until_disconnected(
        request,
        context.service.predict(body.texts, context.meta(body.model_version)),
    )
    return answer(context, result, scores=result.values)


@router.post(
    "/embed",
    operation_id="embed",
    summary="Embed texts",
    response_model=EmbedResponse,
    responses=INFERENCE_ERRORS,
    openapi_extra={"parameters": [REQUEST_TIMEOUT_PARAMETER]},
)
async def embed(body: EmbedRequest, request: Request, context: InferenceContextDep) -> Response:
    """Run the texts through the text-embedding ensemble; one L2-normalised vector per text."""
    result = await until_disconnected(
        request,
        context.service.embed(body.texts, context.meta(body.model_version)),
    )
    return answer(context, result, dimension=int(result.values.shape[1]), embeddings=result.values)
