"""gRPC vs system shared memory, through the gateway's own ``TritonClient`` (no HTTP).

``python -m load.shm_bench --repository model_repository [--reps 20]`` renders the CPU profile of
a built repository, starts an embedded Triton, and times ``/v1/embed``-equivalent calls
(``text_embedding_v1``, output [n, 384] FP32) with 1, 64 and 512 texts over both transports,
interleaved so that drift hits both alike. Prints a markdown table: p50/p99 per transport and the
payload (serialized input + output bytes) of each size.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from build_models.profiles import render_repository
from devtools.triton import EmbeddedTriton
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings, Transport
from gateway.triton.client import TritonClient
from gateway.triton.codecs import serialize_bytes

MODEL, OUTPUT, DIM = "text_embedding_v1", "embedding", 384
SIZES = (1, 64, 512)


def texts(n: int) -> list[str]:
    """Short, review-like texts (the encoder cost grows with length; this measures transport)."""
    return [f"Review {i}: decent kettle, boils fast, lid a bit loose." for i in range(n)]


async def measure(
    url: str, reps: dict[int, int]
) -> list[tuple[int, int, list[float], list[float]]]:
    """Per size: n, payload bytes, gRPC latencies, shm latencies (seconds)."""
    metrics = GatewayMetrics(CollectorRegistry())

    def settings(transport: Transport) -> Settings:
        return Settings(
            _env_file=None,
            triton_grpc_url=url,
            transport=transport,
            shm_pool_size=1,
            shm_region_bytes=4 * 1024 * 1024,
            shm_prefix="shm-bench",
        )

    plain = TritonClient(settings("grpc"), metrics)
    shm_client = TritonClient(settings("system_shm"), metrics)
    results = []
    try:
        await shm_client.connect()
        model = await plain.model_info(MODEL, 30)
        for n in SIZES:
            batch = texts(n)
            payload = len(serialize_bytes(batch)) + n * DIM * 4
            grpc_times: list[float] = []
            shm_times: list[float] = []
            for client in (plain, shm_client):  # one warm-up call each
                await client.infer_texts(model, batch, OUTPUT, timeout_s=120)
            for _ in range(reps[n]):
                for client, times in ((plain, grpc_times), (shm_client, shm_times)):
                    started = time.perf_counter()
                    outcome = await client.infer_texts(model, batch, OUTPUT, timeout_s=120)
                    times.append(time.perf_counter() - started)
                    expected = "grpc" if client is plain else "system_shm"
                    assert outcome.transport == expected, outcome.transport
            results.append((n, payload, grpc_times, shm_times))
    finally:
        await shm_client.close()
        await plain.close()
    return results


def ms(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q) * 1000:.2f}"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--reps", type=int, default=20, help="repetitions for 1 and 64 texts")
    parser.add_argument("--reps-512", type=int, default=5, help="repetitions for 512 texts")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repository = render_repository(work / "cpu", "cpu", args.repository)
        server = EmbeddedTriton(repository, work / "triton")
        server.start()
        try:
            reps = {1: args.reps, 64: args.reps, 512: args.reps_512}
            rows = asyncio.run(measure(server.grpc_url, reps))
        finally:
            server.stop()
    print("| texts | payload bytes | reps | gRPC p50 ms | gRPC p99 ms | shm p50 ms | shm p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for n, payload, grpc_times, shm_times in rows:
        print(
            f"| {n} | {payload} | {len(grpc_times)} | {ms(grpc_times, 50)} | {ms(grpc_times, 99)}"
            f" | {ms(shm_times, 50)} | {ms(shm_times, 99)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
