"""Set torch up in this process exactly as Triton's CPU ``bert`` instance is set up.

The baseline server and the raw in-process benchmark both use this, so neither is handicapped
(or helped) by thread or JIT settings that differ from what Triton runs.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from build_models.pipeline import ReferencePipeline

DEFAULT_TORCH_THREADS = 2
# Padded lengths (multiples of 16) the warm-up runs through, up to the tokenizer's truncation.
WARMUP_WORD_COUNTS = (1, 12, 30, 60, 200)


def load_pipeline(
    repository: Path, torch_threads: int = DEFAULT_TORCH_THREADS
) -> ReferencePipeline:
    """A ReferencePipeline set up like Triton's CPU bert: N torch threads, no JIT re-profiling."""
    import torch

    from build_models.pipeline import ReferencePipeline

    # Same as build_models/cpu_models/bert.py: shapes change with every padded length, and the
    # profiling executor would re-specialise the graph for each one.
    torch._C._jit_set_profiling_executor(False)
    torch._C._get_graph_executor_optimize(False)
    torch.set_num_threads(torch_threads)
    with warnings.catch_warnings():
        # TorchScript is the deliberate format: it is what Triton's libtorch backend reads.
        warnings.filterwarnings("ignore", r".*torch\.jit\.load.*", DeprecationWarning)
        return ReferencePipeline(repository, torch_threads=torch_threads)


def warm_up(pipeline: ReferencePipeline) -> None:
    """Run every padded length once so the first real request pays no first-call costs."""
    for words in WARMUP_WORD_COUNTS:
        text = " ".join(["good"] * words)
        pipeline.score([text])
        pipeline.score([text] * 8)
