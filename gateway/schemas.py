"""Request and response bodies of the public API (the OpenAPI document is generated from them)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from gateway.settings import MODEL_VERSION_PATTERN

ModelVersion = Annotated[
    str,
    StringConstraints(pattern=MODEL_VERSION_PATTERN),
    Field(
        description=(
            "Pin a pipeline version (a positive integer, loaded); default: the traffic policy "
            "chooses (stable, or the canary for a share of the API keys)"
        )
    ),
]


# A text is blank when every character is whitespace as Python's ``str.isspace`` defines it (what
# ``str.strip`` removes). The published ``pattern`` spells those characters out instead of using
# ``\S``: ECMA-262, Python and Rust regex engines each mean a different set by ``\s`` (U+001C-U+001F,
# U+0085, U+FEFF differ), and a generated SDK, the gateway and a fuzzer must agree on every text.
NON_BLANK_PATTERN = (
    r"[^\x09-\x0d\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
)
_NON_BLANK = re.compile(NON_BLANK_PATTERN)

# The item schema says "not blank"; the validator below enforces it with a message that names the
# blank texts (pydantic's own pattern error would only quote the regex). The limits
# (``maxItems``, ``maxLength``) depend on the settings: gateway/openapi.py adds them per app.
Text = Annotated[str, Field(json_schema_extra={"pattern": NON_BLANK_PATTERN})]


def is_blank(text: str) -> bool:
    """True when ``text`` has no character outside :data:`NON_BLANK_PATTERN`'s whitespace."""
    return _NON_BLANK.search(text) is None


class TextsRequest(BaseModel):
    """Texts to run through a model, in the order the results come back."""

    model_config = ConfigDict(extra="forbid")

    texts: list[Text] = Field(
        min_length=1,
        description=(
            "Texts to score, in the order the results come back: at least 1 and at most this "
            "gateway's limit (`maxItems`); each with a character other than whitespace "
            "(`pattern`) and at most this gateway's limit of characters (`maxLength`)."
        ),
    )
    model_version: ModelVersion | None = None

    @field_validator("texts")
    @classmethod
    def _no_blank_texts(cls, texts: list[str]) -> list[str]:
        blank = [index for index, text in enumerate(texts) if is_blank(text)]
        if blank:
            raise ValueError(f"texts must not be empty or whitespace-only (indexes {blank[:10]})")
        return texts


class PredictRequest(TextsRequest):
    """Body of ``POST /v1/predict``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"texts": ["Great blender, works perfectly.", "Broke in a day."]}]
        },
    )


class EmbedRequest(TextsRequest):
    """Body of ``POST /v1/embed``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"texts": ["Great blender, works perfectly."]}]},
    )


class PredictResponse(BaseModel):
    """One score per text, in the order of the request's texts."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model_name": "text_regression",
                    "model_version": "1",
                    "scores": [4.62, 1.37],
                    "request_id": "5f0c2d3e8a9b4c1d",
                }
            ]
        }
    )

    model_name: str
    model_version: str
    scores: list[float]
    request_id: str


class EmbedResponse(BaseModel):
    """One L2-normalised embedding per text, in the order of the request's texts."""

    model_name: str
    model_version: str
    dimension: int
    embeddings: list[list[float]]
    request_id: str


class ModelState(BaseModel):
    """A model (version) in Triton's repository."""

    name: str
    version: str
    state: str
    reason: str


class ModelsResponse(BaseModel):
    """What Triton serves and which models the gateway routes to."""

    routes: dict[str, str] = Field(description="API route -> Triton model name")
    models: list[ModelState]


PipelineVersionNumber = Annotated[
    int, Field(ge=1, le=999_999_999, description="A pipeline version")
]


class TrafficPolicyModel(BaseModel):
    """Where traffic goes: stable, an optional canary for a share of the API keys (sticky per
    key), an optional shadow that gets a copy of the traffic (answers compared, never returned)."""

    model_config = ConfigDict(title="TrafficPolicy")

    revision: int = Field(description="Increases with every change")
    stable: int
    canary: int | None
    canary_percent: float = Field(ge=0, le=100)
    shadow: int | None
    shadow_percent: float = Field(gt=0, le=100, description="Share of requests copied to shadow")
    previous_stable: int | None = Field(description="What a rollback without a canary returns to")
    updated_at: float = Field(description="Unix time of the change")
    updated_by: str = Field(
        description="Who changed it: an admin key's digest prefix, or canary-guard"
    )
    reason: str


class PolicyUpdate(BaseModel):
    """A whole new policy (every version it names must be loaded)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"stable": 1, "canary": 2, "canary_percent": 10}]},
    )

    stable: PipelineVersionNumber
    canary: PipelineVersionNumber | None = None
    canary_percent: float = Field(0.0, ge=0, le=100)
    shadow: PipelineVersionNumber | None = None
    shadow_percent: float = Field(100.0, gt=0, le=100)


class CanaryUpdate(BaseModel):
    """Send a share of the API keys to a loaded version."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"version": 2, "percent": 10}]}
    )

    version: PipelineVersionNumber
    percent: float = Field(gt=0, le=100, description="Share of the API keys, in percent")


class ShadowUpdate(BaseModel):
    """Copy (a share of) the traffic to a loaded version, or stop: null."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"version": 2, "percent": 10}]}
    )

    version: PipelineVersionNumber | None
    percent: float = Field(100.0, gt=0, le=100, description="Share of requests copied, in percent")


class PolicyResponse(BaseModel):
    """The traffic policy now and the changes before it (newest first)."""

    policy: TrafficPolicyModel
    history: list[TrafficPolicyModel]


class VersionStatusModel(BaseModel):
    """A pipeline version: its state here, its roles in the policy, its build manifest."""

    model_config = ConfigDict(title="PipelineVersion")

    version: int
    state: str = Field(
        description="available (built, not loaded), loading, ready, unloading, failed, or "
        "loaded_elsewhere (loaded in Triton, not warmed up by this gateway)",
        examples=["ready"],
    )
    roles: list[str] = Field(description="stable, canary, shadow", examples=[["stable"]])
    in_flight: int = Field(description="Requests this gateway is serving on it now")
    reason: str = Field(description="Why it failed to load, when it did")
    manifest: dict[str, Any] | None = Field(
        description="The build manifest (versions, data, forest metrics, artifact digests); "
        "read from Triton once the version is loaded"
    )


class VersionsResponse(BaseModel):
    """Every pipeline version and the traffic policy."""

    policy: TrafficPolicyModel | None
    versions: list[VersionStatusModel]


class ErrorDetail(BaseModel):
    """What went wrong."""

    code: str = Field(
        description="Stable machine-readable error code", examples=["invalid_request"]
    )
    message: str = Field(description="Human-readable explanation")
    request_id: str


class ErrorResponse(BaseModel):
    """The single error shape of every non-2xx answer."""

    error: ErrorDetail


class HealthResponse(BaseModel):
    """Liveness or readiness, with the reason when not ready."""

    status: str = Field(examples=["ready", "not_ready", "alive"])
    reason: str | None = None
