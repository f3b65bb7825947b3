"""FastAPI dependencies as ``Annotated`` aliases: what a route needs, resolved per request.

The inference routes take one dependency, :func:`inference_context`, that reads its headers
itself: FastAPI's per-parameter resolution of a tree of small dependencies cost about 1 ms of CPU
per request, more than the rest of the gateway (docs/benchmarks.md). Every dependency is
``async`` because FastAPI runs plain ``def`` dependencies in a thread pool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request, Response

from gateway import errors
from gateway.auth import KeyRing, Principal, presented_key, require_scope
from gateway.context import request_id_var
from gateway.rate_limit import RateLimiter
from gateway.service import InferenceService, RequestMeta
from gateway.settings import Settings

REQUEST_TIMEOUT_HEADER = "x-request-timeout"
# The shortest deadline a caller may ask for: below a millisecond no Triton call can finish, so such
# a value is a mistake (5e-324 was one), refused as 422 rather than answered with a certain 504.
MIN_REQUEST_TIMEOUT_S = 0.001
# A JSON number, as the document's ``type: number`` says: float() alone would also take "nan",
# "inf", "1_0", " 1" and non-ASCII digits, none of which a schema-validating client could send.
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# Documented by hand because inference_context reads it from the request directly.
REQUEST_TIMEOUT_PARAMETER: dict[str, Any] = {
    "name": "X-Request-Timeout",
    "in": "header",
    "required": False,
    "description": (
        f"Seconds this request may take, at least {MIN_REQUEST_TIMEOUT_S}; capped at the "
        "gateway's configured deadline"
    ),
    "schema": {"type": "number", "minimum": MIN_REQUEST_TIMEOUT_S},
}


@dataclass(frozen=True)
class InferenceContext:
    """What an inference route needs: the service, the caller, the request id, the deadline, and
    the rate-limit headers its answer carries."""

    service: InferenceService
    principal: Principal
    request_id: str
    timeout_s: float
    headers: dict[str, str]

    def meta(self, model_version: str | None) -> RequestMeta:
        """What the service needs of this request, for ``model_version`` (None: the policy's)."""
        return RequestMeta(self.principal.digest, model_version, self.timeout_s, self.request_id)


async def get_service(request: Request) -> InferenceService:
    """The app's inference service."""
    service: InferenceService = request.app.state.service
    return service


def authenticate(request: Request) -> Principal:
    """The caller, from ``Authorization: Bearer`` or ``X-API-Key`` (401 when missing or invalid)."""
    keyring: KeyRing = request.app.state.keyring
    headers = request.headers
    return keyring.authenticate(
        presented_key(headers.get("authorization"), headers.get("x-api-key"))
    )


def request_deadline(request: Request, settings: Settings) -> float:
    """The request's deadline in seconds: the caller's, but never more than the configured one.

    ``X-Request-Timeout`` must be a number (JSON syntax) of at least :data:`MIN_REQUEST_TIMEOUT_S`
    seconds; anything else (NaN, infinity, zero, negative, too small, not a number) is 422.
    """
    raw = request.headers.get(REQUEST_TIMEOUT_HEADER)
    if raw is None:
        return settings.request_timeout_s
    # A numeral too large for a float reads as inf: a valid, huge number, capped below like any other.
    asked = float(raw) if _JSON_NUMBER.fullmatch(raw) else None
    if asked is None or not asked >= MIN_REQUEST_TIMEOUT_S:
        raise errors.InvalidRequest(
            f"X-Request-Timeout must be a number of seconds, at least {MIN_REQUEST_TIMEOUT_S}"
        )
    return min(asked, settings.request_timeout_s)


def admit_caller(request: Request) -> tuple[Principal, dict[str, str]]:
    """Authenticate for the ``infer`` scope (401/403) and count the request against the key's
    rate limit (429); return the caller and the rate-limit headers to answer with."""
    principal = require_scope(authenticate(request), "infer")
    limiter: RateLimiter = request.app.state.rate_limiter
    return principal, limiter.check(principal.digest, principal.rate_limit)


async def inference_context(request: Request) -> InferenceContext:
    """The caller (401/403/429, :func:`admit_caller`) and the deadline (422 if malformed)."""
    principal, headers = admit_caller(request)
    settings: Settings = request.app.state.settings
    return InferenceContext(
        service=request.app.state.service,
        principal=principal,
        request_id=request_id_var.get(),
        timeout_s=request_deadline(request, settings),
        headers=headers,
    )


async def inference_principal(request: Request, response: Response) -> Principal:
    """The caller (:func:`admit_caller`), for routes that need nothing else; the rate-limit
    headers go on the route's answer."""
    principal, headers = admit_caller(request)
    response.headers.update(headers)
    return principal


async def admin_principal(request: Request) -> Principal:
    """The caller, who must hold the ``admin`` scope (401/403); admin calls have no rate limit:
    they are few, and a rollback must never wait behind a 429."""
    return require_scope(authenticate(request), "admin")


ServiceDep = Annotated[InferenceService, Depends(get_service)]
InferencePrincipal = Annotated[Principal, Depends(inference_principal)]
InferenceContextDep = Annotated[InferenceContext, Depends(inference_context)]
AdminPrincipal = Annotated[Principal, Depends(admin_principal)]
