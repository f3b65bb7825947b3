"""Model repositories for the GPU check, built on the GPU host itself.

Nothing large travels to the host: each encoder is a BERT of a named shape with random weights
(seeded), written as a Hugging Face directory with MiniLM's tokenizer, then built by the project's
own builder (``python -m build_models --bert DIR``: TorchScript export checked against eager,
forest on its embeddings, Treelite checkpoint, manifest). Random weights give the real shapes,
hence real timings; scores carry no meaning.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from build_models.profiles import MODELS
from build_models.versions import read_manifest

ROOT = Path(__file__).resolve().parent.parent.parent
TOKENIZER_FILES = (
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "sentence_bert_config.json",
)


@dataclass(frozen=True)
class Shape:
    """A BERT encoder's shape (what decides its cost), and the forest built on it."""

    name: str
    hidden_size: int
    layers: int
    heads: int
    intermediate_size: int
    # Rows of demo data embedded on the host's CPU to train the forest (cost grows with the encoder).
    demo_rows: int


# all-MiniLM-L6-v2 (the default build) and BERT-large (the reference pipeline's encoder).
MINILM = Shape("minilm", 384, 6, 12, 1536, demo_rows=1000)
BERT_LARGE = Shape("bert-large", 1024, 24, 16, 4096, demo_rows=300)
SHAPES = (MINILM, BERT_LARGE)
FOREST_ARGS = ("--trees", "50", "--max-depth", "16")


def copy_committed_configs(destination: Path) -> Path:
    """The committed templates of every model (configs, preprocess/1/model.py), no artifacts.

    A local build's later part versions (preprocess/2/model.py, ...) are artifacts: left behind.
    """
    for name in MODELS:
        source = ROOT / "model_repository" / name
        for item in source.rglob("*"):
            committed = item.name in ("config.pbtxt", ".gitkeep") or item.relative_to(
                source
            ) == Path("1", "model.py")
            if item.is_file() and committed:
                target = destination / name / item.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(item, target)
    return destination


def random_encoder(shape: Shape, minilm: Path, destination: Path, seed: int = 0) -> Path:
    """A Hugging Face BERT directory: random weights of ``shape``, MiniLM's tokenizer files."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(str(minilm / "config.json"))
    config.hidden_size = shape.hidden_size
    config.num_hidden_layers = shape.layers
    config.num_attention_heads = shape.heads
    config.intermediate_size = shape.intermediate_size
    torch.manual_seed(seed)
    model = BertModel(config)
    model.eval()  # type: ignore[no-untyped-call]
    destination.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(destination))
    for name in TOKENIZER_FILES:
        shutil.copy2(minilm / name, destination / name)
    return destination


def build_repository(shape: Shape, minilm: Path, work: Path) -> dict[str, Any]:
    """Build ``shape``'s repository under ``work`` with the project's builder; return its manifest
    (plus the repository's path under ``"repository"``)."""
    source = random_encoder(shape, minilm, work / f"{shape.name}-hf")
    repository = copy_committed_configs(work / f"{shape.name}-repository")
    command = [
        sys.executable, "-m", "build_models", "--repository", str(repository),
        "--bert", str(source), "--demo-rows", str(shape.demo_rows), *FOREST_ARGS, "--force",
    ]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT)
    # The Hugging Face copy (1.3 GB for BERT-large) is not needed once exported.
    shutil.rmtree(source, ignore_errors=True)
    # --force on a fresh copy: version 1, the only one.
    manifest: dict[str, Any] = read_manifest(repository, 1)
    return {**manifest, "repository": str(repository)}
