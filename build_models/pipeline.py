"""The whole pipeline in-process (tokenizer -> TorchScript -> Treelite), from the built artifacts.

It is the reference the tests hold Triton to, the raw-throughput yardstick of the benchmarks and
the engine of the naive baseline server. Tokenization and padding come from the preprocess
model's own module, so the reference cannot drift from what Triton runs.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Mapping, Sequence
from functools import cache, cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from build_models.versions import latest_version, part_versions, read_manifest

DEFAULT_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"


@cache
def preprocess_module(repository: Path = DEFAULT_REPOSITORY, part_version: int = 1) -> ModuleType:
    """Import ``preprocess/<part_version>/model.py`` of ``repository`` as a plain module.

    Version 1's is the committed file; a later part version has its own copy, taken at build time.
    """
    path = repository / "preprocess" / str(part_version) / "model.py"
    spec = importlib.util.spec_from_file_location("textscore_preprocess_model", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pad_to_multiple_of(repository: Path = DEFAULT_REPOSITORY) -> int:
    """The padding multiple set in ``preprocess/config.pbtxt``: the one place it is configured."""
    from build_models.profiles import read_config

    config = read_config(repository / "preprocess" / "config.pbtxt")
    return int(config.parameters["pad_to_multiple_of"].string_value)


def part_paths(repository: Path, parts: Mapping[str, int]) -> dict[str, Path]:
    """Where each artifact of the part versions ``parts`` lies inside a source repository."""
    return {
        "tokenizer": repository / "preprocess" / str(parts["preprocess"]) / "tokenizer.json",
        "encoder": repository / "bert" / str(parts["bert"]) / "model.pt",
        "forest": repository / "forest" / str(parts.get("forest", 0)) / "checkpoint.tl",
    }


def artifact_paths(repository: Path, version: int) -> dict[str, Path]:
    """The artifacts of pipeline ``version``, read through its manifest's part versions."""
    return part_paths(repository, part_versions(read_manifest(repository, version)))


class ReferencePipeline:
    """Tokenize, encode and score texts in this process, exactly as the Triton ensemble does."""

    def __init__(
        self,
        repository: Path = DEFAULT_REPOSITORY,
        version: int | None = None,
        torch_threads: int | None = None,
        device: str = "cpu",
        parts: Mapping[str, int] | None = None,
    ) -> None:
        """Load pipeline ``version`` of ``repository`` (None: the highest built version).

        ``parts`` (part name -> part version) loads parts directly instead, for the builder,
        which embeds its training texts before the version's manifest exists. The encoder runs
        on ``device`` (e.g. ``cuda:0`` for the naive baseline on a GPU), tokenizer and forest on
        the host.
        """
        import torch
        import treelite

        if torch_threads:
            torch.set_num_threads(torch_threads)
        if parts is None:
            chosen = latest_version(repository) if version is None else version
            if chosen is None:
                raise FileNotFoundError(
                    f"no pipeline version is built in {repository}: run python -m build_models"
                )
            parts = part_versions(read_manifest(repository, chosen))
            self.version: int | None = chosen
        else:
            self.version = version
        self.parts = dict(parts)
        paths = part_paths(repository, parts)
        self._torch = torch
        self.device = torch.device(device)
        self.pad_multiple = pad_to_multiple_of(repository)
        self._preprocess = preprocess_module(repository, int(parts["preprocess"]))
        self.tokenizer = self._preprocess.load_tokenizer(str(paths["tokenizer"]))
        with warnings.catch_warnings():
            # TorchScript is deprecated in torch >= 2.10 but is what Triton's PyTorch backend reads.
            warnings.filterwarnings(
                "ignore", message=".*torch.jit.load.*", category=DeprecationWarning
            )
            self.encoder = torch.jit.load(  # type: ignore[no-untyped-call]
                str(paths["encoder"]), map_location=self.device
            ).eval()
        # The builder loads the encoder parts alone (no "forest" key) to embed its training data.
        self.forest: Any | None = (
            treelite.Model.deserialize(str(paths["forest"]))
            if "forest" in parts and paths["forest"].exists()
            else None
        )

    def tokenize(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Token ids and mask for one request, padded like the preprocess model pads it."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=True)
        ids = [encoding.ids for encoding in encodings]
        input_ids, mask = self._preprocess.pad_token_ids(ids, self.pad_multiple)
        return input_ids, mask

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """L2-normalised embeddings, shape (n, dim) float32, for one request of texts."""
        input_ids, mask = self.tokenize(texts)
        return self._encode(input_ids, mask)

    def _encode(
        self, input_ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        torch = self._torch
        with torch.inference_mode():
            output = self.encoder(
                torch.from_numpy(input_ids).to(self.device), torch.from_numpy(mask).to(self.device)
            )
        return np.asarray(output.cpu().numpy(), dtype=np.float32)

    def score_embeddings(self, embeddings: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Forest scores, shape (n,) float32."""
        from build_models.forest import predict_checkpoint

        if self.forest is None:
            raise FileNotFoundError("no forest checkpoint in this repository")
        return predict_checkpoint(self.forest, embeddings).reshape(-1)

    def score(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Scores, shape (n,) float32, for one request of texts."""
        return self.score_embeddings(self.embed(texts))

    def embed_many(self, texts: Sequence[str], batch_size: int = 64) -> npt.NDArray[np.float32]:
        """Embed a large list in length-sorted batches (little padding), returned in input order."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        result = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            result[chunk] = self.embed([texts[i] for i in chunk])
        return result

    @cached_property
    def dimension(self) -> int:
        """Embedding width of the encoder."""
        probe_ids, probe_mask = self.tokenize([""])
        return int(self._encode(probe_ids, probe_mask).shape[1])
