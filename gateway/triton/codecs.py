"""Tensor codecs: texts to Triton BYTES tensors and back, and Triton's BYTES wire format."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as grpcclient

TEXT_INPUT = "text"


def texts_to_array(texts: Sequence[str]) -> npt.NDArray[np.object_]:
    """UTF-8 encode ``texts`` into the [n, 1] object array a TYPE_STRING input of dims [1] takes."""
    array = np.empty((len(texts), 1), dtype=np.object_)
    array[:, 0] = [text.encode("utf-8") for text in texts]
    return array


def text_input(texts: Sequence[str]) -> grpcclient.InferInput:
    """A gRPC InferInput carrying ``texts`` in the message body."""
    array = texts_to_array(texts)
    tensor = grpcclient.InferInput(TEXT_INPUT, list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


def serialize_bytes(texts: Sequence[str]) -> bytes:
    """Triton's BYTES serialization: each element as a 4-byte little-endian length, then its bytes."""
    parts = []
    for text in texts:
        encoded = text.encode("utf-8")
        parts.append(struct.pack("<I", len(encoded)))
        parts.append(encoded)
    return b"".join(parts)
