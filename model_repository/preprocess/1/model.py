"""Triton Python-backend tokenizer: TYPE_STRING texts -> padded ``input_ids`` / ``attention_mask``.

Runs on the Triton container's Python (3.10) and on the embedded server's, so it sticks to
syntax both accept. The padding policy lives in :func:`pad_token_ids`, which the build's
reference pipeline and the tests import, so Triton and the reference can never disagree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

try:  # Only present inside Triton; the module stays importable for tests and the reference pipeline.
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - exercised outside Triton
    pb_utils = None

TOKENIZER_FILE = "tokenizer.json"


def padded_length(lengths: Sequence[int], multiple: int) -> int:
    """Length every sequence of one request is padded to: its longest, rounded up to ``multiple``."""
    longest = max(lengths) if lengths else 0
    return max(multiple, -(-longest // multiple) * multiple)


def pad_token_ids(
    token_ids: Sequence[Sequence[int]], multiple: int, xp: Any = np
) -> tuple[Any, Any]:
    """Pad token id lists into ``(input_ids, attention_mask)`` INT64 arrays of the array module ``xp``.

    ``xp`` is numpy on a CPU instance and cupy on a GPU instance: the padded arrays are built
    directly on the device that the encoder reads them from.
    """
    lengths = [len(ids) for ids in token_ids]
    width = padded_length(lengths, multiple)
    host_ids = np.zeros((len(token_ids), width), dtype=np.int64)
    host_mask = np.zeros((len(token_ids), width), dtype=np.int64)
    for row, ids in enumerate(token_ids):
        host_ids[row, : len(ids)] = ids
        host_mask[row, : len(ids)] = 1
    if xp is np:
        return host_ids, host_mask
    # One host->device copy per tensor; everything downstream stays on the device.
    return xp.asarray(host_ids), xp.asarray(host_mask)


def load_tokenizer(path: str) -> Any:
    """Load ``tokenizer.json`` with truncation kept (set at build time) and padding turned off.

    The file shipped with all-MiniLM-L6-v2 pads every text to 128; padding is done per request here.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_padding()
    return tokenizer


def decode_texts(raw: np.ndarray) -> list[str]:
    """Turn a TYPE_STRING tensor (bytes objects, shape [n, 1]) into Python strings."""
    texts = []
    for item in raw.reshape(-1):
        if isinstance(item, bytes):
            texts.append(item.decode("utf-8", errors="replace"))
        else:
            texts.append(str(item))
    return texts


class TorchOnDevice:
    """An ``asarray`` that puts arrays on one torch device (torch takes the device per call;
    CuPy uses the current device instead)."""

    __name__ = "torch"

    def __init__(self, torch: Any, device: str) -> None:
        self.torch = torch
        self.device = device

    def asarray(self, array: np.ndarray) -> Any:
        """``array`` as a tensor on the device."""
        try:
            return self.torch.as_tensor(array, device=self.device)
        except RuntimeError:
            # "Numpy is not available": a torch built against a newer numpy than the stub's
            # numpy<2 may lack its numpy bridge; DLPack needs none.
            return self.torch.from_dlpack(np.ascontiguousarray(array)).to(self.device)


class TritonPythonModel:
    """Tokenizes each request's texts in one ``encode_batch`` call per ``execute``."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = {
            key: value["string_value"] for key, value in config.get("parameters", {}).items()
        }
        # Set only in config.pbtxt; the reference pipeline reads it from there too.
        self.pad_multiple = int(parameters["pad_to_multiple_of"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = load_tokenizer(os.path.join(version_dir, TOKENIZER_FILE))
        device_id = int(args.get("model_instance_device_id", "0"))
        self.xp, self.use_dlpack = self._choose_tensor_library(
            parameters.get("tensor_library", "auto"),
            args.get("model_instance_kind", "CPU"),
            device_id,
        )
        if self.xp.__name__ == "cupy":
            self.xp.cuda.Device(device_id).use()
        if pb_utils is not None:
            # The GPU check reads this line to know where the tensors were really built.
            default = f"cuda:{device_id}" if self.xp.__name__ == "cupy" else "cpu"
            where = getattr(self.xp, "device", default)
            handed = ", handed on by DLPack" if self.use_dlpack else ""
            pb_utils.Logger.log_info(
                f"preprocess: tensors built with {self.xp.__name__} on {where}{handed}"
            )

    @staticmethod
    def _choose_tensor_library(
        setting: str, instance_kind: str, device_id: int
    ) -> tuple[Any, bool]:
        if setting == "numpy":
            return np, False
        if setting in ("torch", "torch_dlpack"):
            # torch tensors on the instance's device, handed on with DLPack. On a CPU instance this
            # drives the GPU code path (numpy 1.x cannot release a DLPack capsule that a consumer
            # renamed; torch can); on a GPU instance it is the GPU path where CuPy cannot be used
            # (CuPy 14 needs numpy 2, which the Python backend's stub cannot read).
            import torch

            device = f"cuda:{device_id}" if instance_kind == "GPU" else "cpu"
            return TorchOnDevice(torch, device), True
        if setting in ("cupy", "auto") and instance_kind == "GPU":
            import cupy

            return cupy, True
        if setting == "cupy":
            raise ValueError("tensor_library 'cupy' needs a KIND_GPU instance")
        return np, False

    def _to_output(self, name: str, array: Any) -> Any:
        if self.use_dlpack:
            return pb_utils.Tensor.from_dlpack(name, array)
        return pb_utils.Tensor(name, array)

    def execute(self, requests: list[Any]) -> list[Any]:
        texts_per_request = [
            decode_texts(pb_utils.get_input_tensor_by_name(request, "text").as_numpy())
            for request in requests
        ]
        all_texts = [text for texts in texts_per_request for text in texts]
        encodings = self.tokenizer.encode_batch(all_texts, add_special_tokens=True)
        responses = []
        start = 0
        for texts in texts_per_request:
            token_ids = [encoding.ids for encoding in encodings[start : start + len(texts)]]
            start += len(texts)
            input_ids, attention_mask = pad_token_ids(token_ids, self.pad_multiple, self.xp)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        self._to_output("input_ids", input_ids),
                        self._to_output("attention_mask", attention_mask),
                    ]
                )
            )
        return responses
