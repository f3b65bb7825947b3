"""The OpenAPI document: error responses generated from the error classes, and the API-key schemes."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from gateway import errors
from gateway.schemas import ErrorResponse

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


def install_openapi(app: FastAPI) -> None:
    """Declare both API-key forms (so generated SDKs send them) and the one error shape."""
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
