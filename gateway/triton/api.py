"""What the gateway needs from Triton: the records it exchanges and the protocol they travel by.

:class:`TritonApi` is satisfied by the real :class:`gateway.triton.client.TritonClient` and by the
unit tests' fake, so everything above the client (service, readiness, routes) runs in tests
without a server. This module imports no ``tritonclient``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class ModelInfo:
    """What the gateway must know of a model before it sends it requests (from its config)."""

    name: str
    # Requests above this many texts are split (0: the model does not batch).
    max_batch_size: int
    # FP32 elements per text of each fixed-shape output: sizes an output placed in shared memory.
    output_elements: Mapping[str, int]
    # The config's string parameters (a pipeline version's ensembles carry its manifest there).
    parameters: Mapping[str, str] = field(default_factory=dict)
    # An ensemble's steps, in order (empty for other models).
    composing_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class InferOutcome:
    """One output tensor of a Triton response and the model version that produced it."""

    array: npt.NDArray[np.float32]
    model_version: str
    transport: str = "grpc"


@dataclass(frozen=True)
class RepositoryEntry:
    """A model version in Triton's repository and its state."""

    name: str
    version: str
    state: str
    reason: str


class TritonApi(Protocol):
    """The Triton calls the gateway makes. Failures raise :class:`gateway.errors.GatewayError`."""

    async def is_ready(self, models: Sequence[str], timeout_s: float) -> tuple[bool, str]:
        """Whether Triton and every one of ``models`` are ready, with a reason when not."""

    async def connect(self) -> None:
        """Set up the transport after every (re)connection (shared-memory registration)."""

    async def model_info(self, model: str, timeout_s: float) -> ModelInfo:
        """Read ``model``'s configuration."""

    async def infer_texts(
        self,
        model: ModelInfo,
        texts: Sequence[str],
        output: str,
        model_version: str = "",
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> InferOutcome:
        """Send ``texts`` to ``model`` and return its ``output`` tensor, one row per text."""

    async def repository_index(self, timeout_s: float) -> list[RepositoryEntry]:
        """Every model version in Triton's repository."""

    async def load_model(self, model: str, timeout_s: float) -> None:
        """Load ``model`` (an ensemble: with its composing models) from the repository."""

    async def unload_model(self, model: str, timeout_s: float) -> None:
        """Unload ``model`` alone (never its composing models: another ensemble may share them)."""

    async def close(self) -> None:
        """Release the connection and every transport resource."""
