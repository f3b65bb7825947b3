"""Traffic for the GPU check, straight to Triton over gRPC, and Triton's own counters.

- :func:`closed_loop`: ``concurrency`` callers each sending requests of ``batch`` texts back to
  back for a while (batch 512 throughput and latency);
- :func:`many_clients`: many callers, one text per request, spread over several processes so
  that the Python client is not what limits the rate (realistic traffic);
- :func:`model_stats`, :func:`stats_delta`: Triton's per-model counters (requests, executions,
  batch sizes the model really ran, queue and compute time) before and after.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

MODEL = "text_regression_v1"


def _request(texts: Sequence[str]) -> Any:
    import tritonclient.grpc.aio as grpcclient

    array = np.empty((len(texts), 1), dtype=np.object_)
    array[:, 0] = [text.encode("utf-8") for text in texts]
    tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


async def _closed_loop(
    url: str, batches: Sequence[Sequence[str]], concurrency: int, seconds: float, model: str
) -> tuple[list[float], float]:
    import tritonclient.grpc.aio as grpcclient

    latencies: list[float] = []
    async with grpcclient.InferenceServerClient(url) as client:
        inputs = [[_request(batch)] for batch in batches]
        deadline = time.perf_counter() + seconds
        position = 0

        async def caller() -> None:
            nonlocal position
            while time.perf_counter() < deadline:
                request = inputs[position % len(inputs)]
                position += 1
                started = time.perf_counter()
                await client.infer(model, request, client_timeout=120)
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, elapsed


async def _send_each(url: str, batches: Sequence[Sequence[str]], model: str) -> None:
    import tritonclient.grpc.aio as grpcclient

    async with grpcclient.InferenceServerClient(url) as client:
        for batch in batches:
            await client.infer(model, [_request(batch)], client_timeout=120)


def summarize(latencies: Sequence[float], texts_per_request: int, elapsed: float) -> dict[str, Any]:
    """Requests, texts/s and latency percentiles (ms) of one measurement."""
    if not latencies:
        return {"requests": 0}
    values = np.asarray(latencies) * 1000
    return {
        "requests": len(latencies),
        "texts_per_s": round(len(latencies) * texts_per_request / elapsed, 1),
        "p50_ms": round(float(np.percentile(values, 50)), 2),
        "p99_ms": round(float(np.percentile(values, 99)), 2),
        "max_ms": round(float(values.max()), 2),
        "seconds": round(elapsed, 2),
    }


def closed_loop(
    url: str,
    batches: Sequence[Sequence[str]],
    concurrency: int,
    seconds: float,
    model: str = MODEL,
    warmup: int = 2,
) -> dict[str, Any]:
    """``concurrency`` callers sending ``batches`` (cycled) to ``model`` for ``seconds``, after
    ``warmup`` requests that are not counted."""
    asyncio.run(_send_each(url, batches[:warmup], model))
    latencies, elapsed = asyncio.run(_closed_loop(url, batches, concurrency, seconds, model))
    texts = len(batches[0]) if batches else 0
    return {"concurrency": concurrency, "batch": texts, **summarize(latencies, texts, elapsed)}


def _client_process(
    url: str, texts: list[str], concurrency: int, seconds: float, start_at: float
) -> tuple[list[float], float]:
    # Every process starts at the same wall-clock moment, after all of them have imported.
    late = time.time() - start_at
    if late < 0:
        time.sleep(-late)
    latencies, _ = asyncio.run(
        _closed_loop(url, [[text] for text in texts], concurrency, seconds, MODEL)
    )
    return latencies, max(0.0, late)


def many_clients(
    url: str,
    texts: Sequence[str],
    clients: int,
    seconds: float,
    processes: int,
    startup_s: float = 5.0,
) -> dict[str, Any]:
    """``clients`` callers (over ``processes`` processes) each sending one text per request,
    all in the same window of ``seconds`` that starts ``startup_s`` from now."""
    processes = max(1, min(processes, clients))
    share = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    chunk = max(1, len(texts) // processes)
    start_at = time.time() + startup_s
    # spawn: this process holds CUDA contexts, which a forked child must not inherit.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [
            pool.submit(
                _client_process,
                url,
                list(texts[i * chunk : (i + 1) * chunk]),
                share[i],
                seconds,
                start_at,
            )
            for i in range(processes)
        ]
        outcomes = [future.result() for future in futures]
    latencies = [value for values, _ in outcomes for value in values]
    late = max(lateness for _, lateness in outcomes)
    return {
        "clients": clients,
        "processes": processes,
        # A process that started late ran a shorter window: the rate below is then a little low.
        "latest_start_s": round(late, 2),
        **summarize(latencies, 1, seconds),
    }


def model_stats(http_url: str, model: str) -> dict[str, Any]:
    """Triton's statistics of ``model`` (latest version) from its HTTP endpoint."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats", timeout=10) as answer:
        stats: dict[str, Any] = json.load(answer)["model_stats"][0]
    return stats


def _batches(stats: dict[str, Any]) -> dict[int, int]:
    return {
        int(item["batch_size"]): int(item["compute_infer"]["count"])
        for item in stats.get("batch_stats", [])
    }


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What a model did between two statistics: texts, executions, the batch sizes it really
    ran, and mean queue and compute time per execution."""
    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    old = _batches(before)
    histogram = {
        size: count - old.get(size, 0)
        for size, count in sorted(_batches(after).items())
        if count - old.get(size, 0) > 0
    }

    def mean_ms(key: str) -> float | None:
        ns = int(after["inference_stats"][key]["ns"]) - int(before["inference_stats"][key]["ns"])
        count = int(after["inference_stats"][key]["count"]) - int(
            before["inference_stats"][key]["count"]
        )
        return round(ns / count / 1e6, 3) if count else None

    return {
        "inferences": inferences,
        "executions": executions,
        "mean_batch": round(inferences / executions, 2) if executions else None,
        "batch_histogram": {str(size): count for size, count in histogram.items()},
        "queue_ms_per_request": mean_ms("queue"),
        "compute_infer_ms_per_request": mean_ms("compute_infer"),
    }
