"""FastAPI dependencies as ``Annotated`` aliases: what a route needs, resolved per request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from gateway import errors
from gateway.auth import KeyRing, Principal, presented_key, require_scope
from gateway.context import request_id_var
from gateway.service import InferenceService
from gateway.settings import Settings


def get_settings(request: Request) -> Settings:
    """The app's settings."""
    settings: Settings = request.app.state.settings
    return settings


def get_service(request: Request) -> InferenceService:
    """The app's inference service."""
    service: InferenceService = request.app.state.service
    return service


def get_request_id() -> str:
    """The id of the current request (from ``X-Request-ID`` or generated)."""
    return request_id_var.get()


def authenticate(
    request: Request,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    """The caller, from its API key (401 when missing or invalid)."""
    keyring: KeyRing = request.app.state.keyring
    return keyring.authenticate(presented_key(authorization, x_api_key))


def inference_principal(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """A caller allowed to run inference (403 otherwise)."""
    return require_scope(principal, "infer")


def request_deadline(
    settings: Annotated[Settings, Depends(get_settings)],
    x_request_timeout: Annotated[
        float | None,
        Header(
            description="Seconds this request may take; capped at the gateway's configured deadline",
            gt=0,
        ),
    ] = None,
) -> float:
    """The request's deadline in seconds: the caller's, but never more than the configured one."""
    if x_request_timeout is None:
        return settings.request_timeout_s
    if x_request_timeout <= 0:
        raise errors.InvalidRequest("X-Request-Timeout must be a positive number of seconds")
    return min(x_request_timeout, settings.request_timeout_s)


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[InferenceService, Depends(get_service)]
RequestIdDep = Annotated[str, Depends(get_request_id)]
InferencePrincipal = Annotated[Principal, Depends(inference_principal)]
DeadlineDep = Annotated[float, Depends(request_deadline)]
