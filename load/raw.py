"""The machine's limit: the whole pipeline in this process, no server, at several batch sizes.

Batches are cut from the realistic text mix in arrival order (not sorted by length), each padded
to its own longest text exactly as the preprocess model pads a request. The best batch size's
texts/s is the figure the served stack is held to.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from load.engine import DEFAULT_TORCH_THREADS, load_pipeline, warm_up
from load.stats import percentile, rate

DEFAULT_BATCH_SIZES = (1, 8, 32, 64, 128)


@dataclass(frozen=True)
class RawResult:
    """Throughput of the in-process pipeline at one batch size."""

    batch_size: int
    batches: int
    texts: int
    elapsed_s: float
    texts_per_s: float
    batch_p50_ms: float
    batch_max_ms: float

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def run_raw_benchmark(
    repository: Path,
    texts: Sequence[str],
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    seconds_per_size: float = 10.0,
    max_texts_per_size: int | None = None,
    torch_threads: int = DEFAULT_TORCH_THREADS,
) -> list[RawResult]:
    """Score ``texts`` in consecutive batches of each size, for at most ``seconds_per_size`` each.

    Every size starts at the beginning of ``texts`` so all sizes see the same mix; each stops
    after a whole batch once its time or text budget is spent.
    """
    pipeline = load_pipeline(repository, torch_threads)
    warm_up(pipeline)
    results = []
    for size in batch_sizes:
        durations: list[float] = []
        done = 0
        started = time.perf_counter()
        position = 0
        while True:
            batch = [texts[(position + i) % len(texts)] for i in range(size)]
            position += size
            t0 = time.perf_counter()
            pipeline.score(batch)
            durations.append(time.perf_counter() - t0)
            done += size
            spent = time.perf_counter() - started
            if spent >= seconds_per_size or (max_texts_per_size and done >= max_texts_per_size):
                break
        elapsed = sum(durations)
        results.append(
            RawResult(
                batch_size=size,
                batches=len(durations),
                texts=done,
                elapsed_s=elapsed,
                texts_per_s=rate(done, elapsed),
                batch_p50_ms=percentile(durations, 50) * 1000,
                batch_max_ms=max(durations) * 1000,
            )
        )
    return results


def best(results: Sequence[RawResult]) -> RawResult:
    """The batch size with the highest texts/s."""
    return max(results, key=lambda result: result.texts_per_s)
