"""Request and response bodies of the public API (the OpenAPI document is generated from them)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from gateway.settings import MODEL_VERSION_PATTERN

ModelVersion = Annotated[
    str,
    StringConstraints(pattern=MODEL_VERSION_PATTERN),
    Field(
        description="Pin a model version (a positive integer); default: the version Triton serves"
    ),
]


class TextsRequest(BaseModel):
    """Texts to run through a model, in the order the results come back."""

    model_config = ConfigDict(extra="forbid")

    texts: list[str] = Field(
        min_length=1,
        description=(
            "Texts to score, 1 to the configured maximum per request (default 512); each non-blank, "
            "at most the configured number of characters (default 10000)."
        ),
    )
    model_version: ModelVersion | None = None

    @field_validator("texts")
    @classmethod
    def _no_blank_texts(cls, texts: list[str]) -> list[str]:
        blank = [index for index, text in enumerate(texts) if not text.strip()]
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
