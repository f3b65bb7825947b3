"""CPU-profile stand-in for the ``forest`` model: the SAME ``checkpoint.tl`` through Treelite GTIL.

The embedded tritonserver has no FIL backend. Tensor names (``input__0``/``output__0``), types
and shapes equal the FIL model's. Python 3.10-compatible.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import treelite
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Scores all requests of one ``execute`` in a single GTIL call."""

    def initialize(self, args: dict[str, str]) -> None:
        path = os.path.join(args["model_repository"], args["model_version"], "checkpoint.tl")
        self.forest = treelite.Model.deserialize(path)

    def execute(self, requests: list[Any]) -> list[Any]:
        features = [pb_utils.get_input_tensor_by_name(r, "input__0").as_numpy() for r in requests]
        stacked = np.ascontiguousarray(np.concatenate(features), dtype=np.float32)
        # One thread: a second OpenMP pool spinning next to torch starves the encoder on a small CPU.
        scores = np.asarray(
            treelite.gtil.predict(self.forest, stacked, nthread=1), dtype=np.float32
        )
        scores = scores.reshape(len(stacked), 1)
        responses = []
        start = 0
        for rows in (len(f) for f in features):
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("output__0", scores[start : start + rows])]
                )
            )
            start += rows
        return responses
