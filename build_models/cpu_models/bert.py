"""Python-backend stand-in for the ``bert`` model: the SAME ``model.pt`` through torch.jit.

The embedded tritonserver has no PyTorch backend. Tensor names, types and shapes equal the GPU
profile's, so the ensembles run unchanged. Tensors arrive and leave by DLPack, without a copy:
on a KIND_CPU instance (the CPU profile) in host memory, on a KIND_GPU instance (the
``embedded-gpu`` profile of the GPU check) in the instance's GPU memory, where the encoder runs.
The same code runs in both. Python 3.10-compatible.
"""

from __future__ import annotations

import json
import os
from typing import Any

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
        self.on_gpu = args.get("model_instance_kind", "CPU") == "GPU"
        self.device = (
            torch.device("cuda", int(args.get("model_instance_device_id", "0")))
            if self.on_gpu
            else torch.device("cpu")
        )
        if self.on_gpu:
            torch.cuda.set_device(self.device)
        # Shapes change with every padded length; the profiling executor would re-specialise on each.
        torch._C._jit_set_profiling_executor(False)
        torch._C._get_graph_executor_optimize(False)
        path = os.path.join(args["model_repository"], args["model_version"], "model.pt")
        # torch.jit.load has no annotations.
        self.encoder = torch.jit.load(path, map_location=self.device).eval()  # type: ignore[no-untyped-call]
        # Where inputs arrived from so far (the warm-up's come from the host, a GPU ensemble's not).
        self._seen: set[bool] = set()

    def _tensor(self, request: Any, name: str) -> tuple[torch.Tensor, bool]:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        # DLPack wherever the tensor lives: a CPU instance runs the very code a GPU one does.
        shared = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        return shared.to(self.device), not tensor.is_cpu()

    def execute(self, requests: list[Any]) -> list[Any]:
        inputs = []
        arrived_on_gpu = False
        for request in requests:
            ids, ids_on_gpu = self._tensor(request, "input_ids")
            mask, _ = self._tensor(request, "attention_mask")
            arrived_on_gpu = arrived_on_gpu or ids_on_gpu
            inputs.append((ids, mask))
        if arrived_on_gpu not in self._seen:
            # The GPU check reads this line: where the inputs came from, where the encoder runs.
            self._seen.add(arrived_on_gpu)
            arrived = "on the GPU by DLPack" if arrived_on_gpu else "in host memory"
            pb_utils.Logger.log_info(f"bert: inputs arrived {arrived}, encoder on {self.device}")
        outputs: list[Any] = [None] * len(requests)
        # Triton batches only same-shape requests, but group defensively: one call per width.
        by_width: dict[int, list[int]] = {}
        for index, (ids, _) in enumerate(inputs):
            by_width.setdefault(int(ids.shape[1]), []).append(index)
        with torch.inference_mode():
            for indices in by_width.values():
                ids = torch.cat([inputs[i][0] for i in indices])
                mask = torch.cat([inputs[i][1] for i in indices])
                embeddings = self.encoder(ids, mask).to(torch.float32)
                start = 0
                for i in indices:
                    rows = int(inputs[i][0].shape[0])
                    outputs[i] = embeddings[start : start + rows]
                    start += rows
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor.from_dlpack("embedding", out.contiguous())]
            )
            for out in outputs
        ]
