"""The naive baseline: one FastAPI process that scores each request on its own, in-process.

This is the "model.predict() in a Python loop" design, built as well as that design allows, so the
comparison is honest: the same tokenizer and dynamic padding (ReferencePipeline shares Triton's
preprocess code), the same TorchScript and Treelite files, the same torch settings as Triton's CPU
bert instance (2 threads, no JIT re-profiling), warmed up before it reports healthy, and inference
in one worker thread so the event loop keeps accepting requests while one is being scored. What
it lacks by design is batching across requests and pipelining of the stages.

It speaks the gateway's contract: ``POST /v1/predict`` with ``{"texts": [...]}`` and an
``X-API-Key`` header, answering ``{"scores": [...], "model": "baseline"}``; ``GET /healthz``.
Configured by environment: ``LOAD_BASELINE_REPOSITORY``, ``LOAD_BASELINE_API_KEY``,
``LOAD_BASELINE_TORCH_THREADS``. Serve it with ``python -m load baseline`` or let the tool start it.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel, Field

from devtools.ports import free_ports
from devtools.process import ManagedServer, child_environment
from devtools.triton import CPU_RUNTIME_ENV
from load.engine import DEFAULT_TORCH_THREADS, load_pipeline, warm_up

MAX_TEXTS_PER_REQUEST = 512
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class PredictRequest(BaseModel):
    """Texts to score."""

    texts: list[str] = Field(min_length=1, max_length=MAX_TEXTS_PER_REQUEST)


class PredictResponse(BaseModel):
    """One score per text, in order."""

    scores: list[float]
    model: str = "baseline"


def create_app() -> FastAPI:
    """The baseline app, configured from ``LOAD_BASELINE_*`` environment variables."""
    repository = Path(os.environ.get("LOAD_BASELINE_REPOSITORY", "model_repository"))
    api_key = os.environ.get("LOAD_BASELINE_API_KEY", "")
    torch_threads = int(os.environ.get("LOAD_BASELINE_TORCH_THREADS", str(DEFAULT_TORCH_THREADS)))
    # One worker thread: one inference at a time (torch already uses every core for one request).
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baseline-inference")
    state: dict[str, object] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        # Load and warm up on the inference thread itself, before the server accepts traffic.
        pipeline = await loop.run_in_executor(executor, load_pipeline, repository, torch_threads)
        await loop.run_in_executor(executor, warm_up, pipeline)
        state["pipeline"] = pipeline
        yield
        executor.shutdown(wait=True)

    app = FastAPI(title="naive baseline", lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/v1/predict", response_model=PredictResponse)
    async def predict(body: PredictRequest, x_api_key: str = Header(default="")) -> PredictResponse:
        if api_key and not hmac.compare_digest(x_api_key.encode(), api_key.encode()):
            raise HTTPException(status_code=401, detail="invalid API key")
        pipeline = state["pipeline"]
        scores = await asyncio.get_running_loop().run_in_executor(
            executor,
            pipeline.score,  # type: ignore[attr-defined]
            body.texts,
        )
        return PredictResponse(scores=[float(value) for value in scores])

    return app


def baseline_server(
    repository: Path,
    api_key: str,
    workdir: Path,
    port: int | None = None,
    torch_threads: int = DEFAULT_TORCH_THREADS,
) -> tuple[ManagedServer, str]:
    """A (not yet started) uvicorn child serving the baseline, and its base URL."""
    port = port or free_ports(1)[0]
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "load.baseline:create_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    env = child_environment(
        {
            # The same OpenMP runtime settings the embedded Triton gets: a like-for-like comparison.
            **CPU_RUNTIME_ENV,
            "LOAD_BASELINE_REPOSITORY": str(repository.resolve()),
            # The key travels by environment, not argv, so it does not show in `ps`.
            "LOAD_BASELINE_API_KEY": api_key,
            "LOAD_BASELINE_TORCH_THREADS": str(torch_threads),
            # The child imports `load.baseline` even when the project is not pip-installed.
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])
            ),
        }
    )
    base_url = f"http://127.0.0.1:{port}"
    server = ManagedServer(command, f"{base_url}/healthz", workdir / "baseline.log", env=env)
    return server, base_url
