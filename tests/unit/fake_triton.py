"""A fake Triton client for the unit layer: satisfies ``TritonApi`` with no server behind it.

Scores are ``len(text) + 1000 * (version - 1)`` and embeddings ``[len(text), index-in-chunk]`` so
a test can check that split requests come back whole and in order, and which pipeline version
answered. Pipeline versions are named as the renderer names them (``text_regression_v2``...).
Failures, slowness and outages are set per test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gateway import errors
from gateway.lifecycle.naming import parse_versioned
from gateway.triton.api import InferOutcome, ModelInfo, RepositoryEntry

EMBEDDING_WIDTH = 2


@dataclass
class InferCall:
    """One ``infer_texts`` call as the fake saw it."""

    model: str
    texts: list[str]
    model_version: str
    timeout_s: float | None
    request_id: str
    cancelled: bool = False


@dataclass
class FakeTriton:
    """In-memory stand-in for :class:`gateway.triton.client.TritonClient`."""

    max_batch_size: int = 8
    ready: bool = True
    not_ready_reason: str = "Triton unreachable"
    # Raised by the next infer calls (all of them while set), instead of answering.
    failure: Exception | None = None
    # The call whose texts contain this marker fails at once (before waiting on the gate).
    fail_on_text: str | None = None
    # When set, infer calls wait for it (a slow Triton); cleared calls proceed at once.
    gate: asyncio.Event | None = None
    calls: list[InferCall] = field(default_factory=list)
    connects: int = 0
    closed: bool = False
    # Pipeline versions in the repository, and which are loaded (version 1 at start).
    versions: set[int] = field(default_factory=lambda: {1})
    loaded: set[int] = field(default_factory=lambda: {1})
    # Versions whose every request fails (a bad build), and load/unload calls seen.
    failing_versions: set[int] = field(default_factory=set)
    lifecycle_calls: list[str] = field(default_factory=list)

    async def is_ready(self, models: Sequence[str], timeout_s: float) -> tuple[bool, str]:
        """The configured verdict."""
        return (True, "ok") if self.ready else (False, self.not_ready_reason)

    async def connect(self) -> None:
        """Counts (re)connections."""
        self.connects += 1

    async def model_info(self, model: str, timeout_s: float) -> ModelInfo:
        """Both ensembles of a loaded version with the configured batch limit."""
        base, version = self._parse(model)
        output = "score" if base == "text_regression" else "embedding"
        width = 1 if output == "score" else EMBEDDING_WIDTH
        manifest = json.dumps({"pipeline_version": version, "parts": {"forest": version}})
        return ModelInfo(
            model,
            self.max_batch_size,
            {output: width},
            parameters={"pipeline_version": str(version), "pipeline_manifest": manifest},
            composing_models=("preprocess_v1", "bert_v1", f"forest_v{version}"),
        )

    def _parse(self, model: str) -> tuple[str, int]:
        parsed = parse_versioned(model)
        if parsed is None or parsed[1] not in self.loaded:
            raise errors.ModelNotFound(f"Triton: model {model} is not loaded")
        return parsed

    async def load_model(self, model: str, timeout_s: float) -> None:
        """Loads a version of the repository."""
        self.lifecycle_calls.append(f"load {model}")
        parsed = parse_versioned(model)
        if parsed is None or parsed[1] not in self.versions:
            raise errors.UpstreamInvalidArgument(f"Triton: failed to load {model}")
        self.loaded.add(parsed[1])

    async def unload_model(self, model: str, timeout_s: float) -> None:
        """Unloads a version (its ensembles; composing model unloads are only recorded)."""
        self.lifecycle_calls.append(f"unload {model}")
        parsed = parse_versioned(model)
        if parsed is not None and parsed[0] == "text_regression":
            self.loaded.discard(parsed[1])

    async def infer_texts(
        self,
        model: ModelInfo,
        texts: Sequence[str],
        output: str,
        model_version: str = "",
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> InferOutcome:
        """Answer from the texts' lengths, or fail / wait as configured."""
        call = InferCall(model.name, list(texts), model_version, timeout_s, request_id)
        self.calls.append(call)
        _, version = self._parse(model.name)
        if (self.fail_on_text is not None and self.fail_on_text in texts) or (
            version in self.failing_versions
        ):
            raise errors.UpstreamError("Triton: the forest failed")
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.failure is not None:
                raise self.failure
        except asyncio.CancelledError:
            call.cancelled = True
            raise
        lengths = np.array([len(text) for text in texts], dtype=np.float32)
        if output == "score":
            array = (lengths + 1000 * (version - 1)).reshape(-1, 1)
        else:
            array = np.stack([lengths, np.arange(len(texts), dtype=np.float32)], axis=1)
        return InferOutcome(array, model_version or "1")

    async def repository_index(self, timeout_s: float) -> list[RepositoryEntry]:
        """Each version's two ensembles, READY when loaded."""
        return [
            RepositoryEntry(
                f"{model}_v{version}", "1", "READY" if version in self.loaded else "UNAVAILABLE", ""
            )
            for version in sorted(self.versions)
            for model in ("text_embedding", "text_regression")
        ]

    async def close(self) -> None:
        """Marks the client closed."""
        self.closed = True

    def infer_calls(self) -> list[InferCall]:
        """The calls that were not warm-ups (warm-ups carry no request id)."""
        return [call for call in self.calls if call.request_id]
