"""``/v1/admin/...``: pipeline versions and the traffic policy (the ``admin`` scope).

Load, canary, shadow, promote, roll back, unload: each a call on the service's version manager.
Every change of the policy is a ``POST`` action under ``/v1/admin/policy/`` (one method per path:
the framework's 405 ``Allow`` names the methods of one route only).
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from gateway import errors
from gateway.deps import AdminPrincipal, ServiceDep
from gateway.lifecycle.manager import VersionStatus
from gateway.lifecycle.policy import TrafficPolicy
from gateway.openapi import AUTH_ERRORS, error_responses
from gateway.schemas import (
    CanaryUpdate,
    PipelineVersionNumber,
    PolicyResponse,
    PolicyUpdate,
    ShadowUpdate,
    VersionsResponse,
    VersionStatusModel,
)

router = APIRouter(prefix="/v1/admin", tags=["admin"])

UPSTREAM = (
    errors.UpstreamUnavailable,
    errors.UpstreamError,
    errors.UpstreamTimeout,
    errors.InternalError,
)
POLICY_ERRORS = error_responses(
    *AUTH_ERRORS,
    errors.BadRequest,
    errors.PayloadTooLarge,
    errors.Conflict,
    errors.InvalidRequest,
    errors.NotReady,
    *UPSTREAM,
)


def _version(status: VersionStatus) -> VersionStatusModel:
    return VersionStatusModel.model_validate(asdict(status))


def _policy(service: ServiceDep) -> PolicyResponse:
    policy = service.versions.policy
    if policy is None:
        raise errors.NotReady("no traffic policy yet", service.settings.retry_after_s)
    return PolicyResponse.model_validate(
        {
            "policy": policy.to_json(),
            "history": [item.to_json() for item in service.versions.history],
        }
    )


def _by(principal: AdminPrincipal) -> str:
    # A digest prefix names the key in the history without revealing anything usable.
    return f"key:{principal.digest[:12]}"


@router.get(
    "/versions",
    operation_id="listVersions",
    summary="Pipeline versions with state, roles and manifest",
    response_model=VersionsResponse,
    responses=error_responses(*AUTH_ERRORS, *UPSTREAM),
)
async def list_versions(service: ServiceDep, _: AdminPrincipal) -> VersionsResponse:
    """Every pipeline version in Triton's repository and the traffic policy."""
    statuses = await service.versions.statuses()
    policy = service.versions.policy
    return VersionsResponse.model_validate(
        {
            "policy": None if policy is None else policy.to_json(),
            "versions": [asdict(status) for status in statuses],
        }
    )


@router.post(
    "/versions/{version}/load",
    operation_id="loadVersion",
    summary="Load a pipeline version and warm it up",
    response_model=VersionStatusModel,
    responses=error_responses(*AUTH_ERRORS, errors.ModelNotFound, errors.Conflict, *UPSTREAM),
)
async def load_version(
    version: PipelineVersionNumber, service: ServiceDep, _: AdminPrincipal
) -> VersionStatusModel:
    """Load the version's ensembles in Triton and run a warm-up through each; answers once it
    can take traffic (no traffic goes to it until the policy says so)."""
    return _version(await service.versions.load(version))


@router.delete(
    "/versions/{version}",
    operation_id="unloadVersion",
    summary="Unload a pipeline version after its requests finished",
    response_model=VersionStatusModel,
    responses=error_responses(*AUTH_ERRORS, errors.ModelNotFound, errors.Conflict, *UPSTREAM),
)
async def unload_version(
    version: PipelineVersionNumber, service: ServiceDep, _: AdminPrincipal
) -> VersionStatusModel:
    """Refused (409) while the policy routes the version; otherwise waits for its requests in
    flight, then unloads it (and composing models no other loaded version uses)."""
    return _version(await service.versions.unload(version))


@router.get(
    "/policy",
    operation_id="getPolicy",
    summary="The traffic policy and its history",
    response_model=PolicyResponse,
    responses=error_responses(*AUTH_ERRORS, errors.NotReady),
)
async def get_policy(service: ServiceDep, _: AdminPrincipal) -> PolicyResponse:
    """The policy every replica applies, and the changes before it (newest first)."""
    return _policy(service)


@router.post(
    "/policy/replace",
    operation_id="replacePolicy",
    summary="Replace the traffic policy",
    response_model=PolicyResponse,
    responses=POLICY_ERRORS,
)
async def set_policy(
    body: PolicyUpdate, service: ServiceDep, principal: AdminPrincipal
) -> PolicyResponse:
    """Set stable, canary (with its share) and shadow at once."""

    def change(policy: TrafficPolicy) -> TrafficPolicy:
        stable_changed = body.stable != policy.stable
        return policy.changed(
            _by(principal),
            "policy set",
            stable=body.stable,
            canary=body.canary,
            canary_percent=body.canary_percent if body.canary is not None else 0.0,
            shadow=body.shadow,
            shadow_percent=body.shadow_percent,
            previous_stable=policy.stable if stable_changed else policy.previous_stable,
        )

    await service.versions.change_policy(change)
    return _policy(service)


@router.post(
    "/policy/canary",
    operation_id="setCanary",
    summary="Send a share of the API keys to a version",
    response_model=PolicyResponse,
    responses=POLICY_ERRORS,
)
async def set_canary(
    body: CanaryUpdate, service: ServiceDep, principal: AdminPrincipal
) -> PolicyResponse:
    """The version becomes canary for ``percent`` of the API keys (each key sticks to its side)."""
    await service.versions.change_policy(
        lambda policy: policy.with_canary(body.version, body.percent, _by(principal))
    )
    return _policy(service)


@router.post(
    "/policy/shadow",
    operation_id="setShadow",
    summary="Copy the traffic to a version, or stop",
    response_model=PolicyResponse,
    responses=POLICY_ERRORS,
)
async def set_shadow(
    body: ShadowUpdate, service: ServiceDep, principal: AdminPrincipal
) -> PolicyResponse:
    """The version gets a copy of every routed request; its answers are compared with the served
    ones (``gateway_shadow_drift``) and never returned."""
    reason = (
        "shadow stopped"
        if body.version is None
        else f"shadow v{body.version} ({body.percent:g} % of requests)"
    )
    await service.versions.change_policy(
        lambda policy: policy.changed(
            _by(principal), reason, shadow=body.version, shadow_percent=body.percent
        )
    )
    return _policy(service)


@router.post(
    "/policy/promote",
    operation_id="promoteCanary",
    summary="Make the canary stable",
    response_model=PolicyResponse,
    responses=POLICY_ERRORS,
)
async def promote(service: ServiceDep, principal: AdminPrincipal) -> PolicyResponse:
    """The canary takes all traffic; the old stable stays loaded for a rollback."""
    await service.versions.change_policy(lambda policy: policy.promoted(_by(principal)))
    return _policy(service)


@router.post(
    "/policy/rollback",
    operation_id="rollback",
    summary="Drop the canary, or return to the previous stable",
    response_model=PolicyResponse,
    responses=POLICY_ERRORS,
)
async def rollback(service: ServiceDep, principal: AdminPrincipal) -> PolicyResponse:
    """With a canary: all traffic back to stable. Without: stable returns to the previous one."""
    await service.versions.change_policy(lambda policy: policy.rolled_back(_by(principal)))
    return _policy(service)
