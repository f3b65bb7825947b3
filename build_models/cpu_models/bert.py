"""CPU-profile stand-in for the ``bert`` model: the SAME ``model.pt`` through torch.jit in the Python backend.

The embedded tritonserver has no PyTorch backend. Tensor names, types and shapes equal the GPU
profile's, so the ensembles run unchanged. Python 3.10-compatible.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Runs every request of one ``execute`` as a single TorchScript call per padded length."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = {
            key: value["string_value"] for key, value in config.get("parameters", {}).items()
        }
        threads = int(parameters.get("torch_num_threads", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        # Shapes change with every padded length; the profiling executor would re-specialise on each.
        torch._C._jit_set_profiling_executor(False)
        torch._C._get_graph_executor_optimize(False)
        path = os.path.join(args["model_repository"], args["model_version"], "model.pt")
        # torch.jit.load has no annotations.
        self.encoder = torch.jit.load(path, map_location="cpu").eval()  # type: ignore[no-untyped-call]

    def execute(self, requests: list[Any]) -> list[Any]:
        inputs = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            inputs.append((ids, mask))
        outputs: list[Any] = [None] * len(requests)
        # Triton batches only same-shape requests, but group defensively: one call per width.
        by_width: dict[int, list[int]] = {}
        for index, (ids, _) in enumerate(inputs):
            by_width.setdefault(ids.shape[1], []).append(index)
        with torch.inference_mode():
            for indices in by_width.values():
                ids = torch.from_numpy(np.concatenate([inputs[i][0] for i in indices]))
                mask = torch.from_numpy(np.concatenate([inputs[i][1] for i in indices]))
                embeddings = self.encoder(ids, mask).numpy().astype(np.float32, copy=False)
                start = 0
                for i in indices:
                    rows = inputs[i][0].shape[0]
                    outputs[i] = embeddings[start : start + rows]
                    start += rows
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("embedding", output)])
            for output in outputs
        ]
