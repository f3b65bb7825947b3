"""The OpenAPI document: error responses generated from the error classes, the API-key schemes,
and the limits of the gateway that serves it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from gateway import errors
from gateway.schemas import ErrorResponse, TextsRequest
from gateway.settings import Settings

API_DESCRIPTION = """
Scores texts with a BERT encoder and a random-forest regressor served by NVIDIA Triton.

Authenticate with `Authorization: Bearer <key>` or `X-API-Key: <key>`. Every error has the shape
`{"error": {"code", "message", "request_id"}}`. Send `X-Request-ID` to correlate logs; send
`X-Request-Timeout` (seconds) to shorten the deadline.
"""

# What any authenticated route can answer besides its own errors.
AUTH_ERRORS: tuple[type[errors.GatewayError], ...] = (errors.Unauthorized, errors.Forbidden)


def error_responses(*error_classes: type[errors.GatewayError]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the errors a route can raise: per status, each error's code and
    what it means (the first line of its class docstring), all in the one error shape."""
    by_status: dict[int, list[str]] = {}
    headers: dict[int, dict[str, Any]] = {}
    for error_class in error_classes:
        for name, meaning in error_class.response_headers.items():
            headers.setdefault(error_class.status_code, {})[name] = {
                "description": meaning,
                "schema": {"type": "string"},
            }
        meaning = (error_class.__doc__ or "").strip().splitlines()[0].replace("``", "`")
        by_status.setdefault(error_class.status_code, []).append(f"`{error_class.code}`: {meaning}")
    responses: dict[int | str, dict[str, Any]] = {}
    for status, lines in sorted(by_status.items()):
        responses[status] = {"model": ErrorResponse, "description": " ".join(lines)}
        if status in headers:
            responses[status]["headers"] = headers[status]
    return responses


def _texts_requests(model: type[TextsRequest] = TextsRequest) -> list[type[TextsRequest]]:
    """``model`` and every request body derived from it."""
    found = [model]
    for subclass in model.__subclasses__():
        found.extend(_texts_requests(subclass))
    return found


def declare_limits(schema: dict[str, Any], settings: Settings) -> None:
    """Publish the configured limits on every request's ``texts`` (``maxItems``, item ``maxLength``).

    They are settings, so they cannot live in the pydantic models; the service enforces them
    (``InferenceService.check_limits``, 422 ``invalid_request``) and the document states the same
    numbers, so a client (or a generated SDK) validating against it is never refused for a body
    the document allows.
    """
    components = schema.get("components", {}).get("schemas", {})
    for model in _texts_requests():
        declared = components.get(model.__name__)
        if declared is None:
            continue
        texts = declared["properties"]["texts"]
        texts["maxItems"] = settings.max_texts_per_request
        texts["items"]["maxLength"] = settings.max_text_chars


def install_openapi(app: FastAPI) -> None:
    """Declare both API-key forms (so generated SDKs send them), the one error shape, and the
    limits of ``app.state.settings``."""
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
        declare_limits(schema, app.state.settings)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
