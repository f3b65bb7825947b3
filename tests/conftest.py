"""Session fixtures (small real models, built once, served by a real embedded tritonserver) and
the helpers every test module shares.

Two layers: ``tests/unit`` runs the gateway over a fake Triton client in seconds; every test that
needs a model build or a real server is marked ``triton`` here, from the fixtures it uses
(``make unit`` runs the first layer alone; ``make test`` runs both).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from build_models.profiles import MODELS, render_repository
from devtools.triton import EmbeddedTriton
from tests.gateway_support import RunningGateway, running_gateway

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".work"
TEXTS = ["Excellent blender, five stars.", "Broke after two days.", "It's an okay kettle.", "ok"]
# Fixtures that build models or start a real tritonserver: a test using any of them is ``triton``.
SERVER_FIXTURES = {"built_repository", "cpu_repository", "triton", "own_triton", "gateway"}


def wait_for(
    predicate: Callable[[], object], timeout: float = 30, what: str = "the condition"
) -> None:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def model_statistics(server: EmbeddedTriton, model: str) -> dict[str, int]:
    """Triton's own counters for ``model``: inferences (texts), executions (batches), successful
    and failed requests."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats") as answer:
        stats = json.load(answer)["model_stats"][0]
    return {
        "inference_count": int(stats["inference_count"]),
        "execution_count": int(stats["execution_count"]),
        "success": int(stats["inference_stats"]["success"]["count"]),
        "fail": int(stats["inference_stats"]["fail"]["count"]),
    }


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs a model build or a real server ``triton``."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SERVER_FIXTURES and "tests/unit/" not in item.nodeid:
            item.add_marker(pytest.mark.triton)


# Small but real: the shipped MiniLM encoder, a few hundred demo rows, a small forest.
FAST_BUILD_ARGS = ["--demo-rows", "300", "--trees", "10", "--max-depth", "8"]


# What of model_repository/ is committed source; anything else there (later part versions'
# copies of model.py included) was built.
COMMITTED_FILES = ("config.pbtxt", ".gitkeep")
COMMITTED_MODEL_PY = Path("preprocess") / "1" / "model.py"


def copy_committed_repository(destination: Path) -> Path:
    """Copy the committed templates (configs, preprocess/1/model.py; no artifacts, no versions)."""
    committed = ROOT / "model_repository"
    for name in MODELS:
        for item in (committed / name).rglob("*"):
            relative = item.relative_to(committed)
            if item.is_file() and (item.name in COMMITTED_FILES or relative == COMMITTED_MODEL_PY):
                target = destination / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(item, target)
    return destination


def run_builder(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m build_models ARGS`` in a child process, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "build_models", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="session")
def built_repository() -> Path:
    """A model repository holding pipeline version 1 alone, small real artifacts (kept between
    sessions: a later session finds version 1 up to date and builds nothing)."""
    repository = WORK / "test-model-repository"
    for _ in range(2):
        copy_committed_repository(repository)
        built = run_builder("--repository", str(repository), *FAST_BUILD_ARGS)
        assert built.returncode == 0, built.stderr
        if built.stdout.startswith("pipeline version 1 "):
            return repository
        # Version 1 there was built from other inputs (an older checkout's): the tests name
        # version 1's models, so start that repository afresh rather than serve version 2.
        shutil.rmtree(repository)
    raise AssertionError(f"the builder did not make version 1 in {repository}: {built.stdout}")


@pytest.fixture(scope="session")
def cpu_repository(built_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU profile rendered from the built repository: pipeline version 1's models."""
    return render_repository(tmp_path_factory.mktemp("cpu-profile"), "cpu", built_repository)


@pytest.fixture(scope="session")
def triton(
    cpu_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedTriton]:
    """A real tritonserver serving both ensembles, shared by the whole session (do not kill it)."""
    server = EmbeddedTriton(cpu_repository, tmp_path_factory.mktemp("triton"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_triton(cpu_repository: Path, tmp_path: Path) -> Iterator[EmbeddedTriton]:
    """A server of the test's own, free to be killed and restarted."""
    server = EmbeddedTriton(cpu_repository, tmp_path / "triton")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gateway(triton: EmbeddedTriton) -> Iterator[RunningGateway]:
    """A ready gateway in front of the session's Triton, with small limits to test them cheaply."""
    with running_gateway(
        triton.grpc_url, max_texts_per_request=64, max_text_chars=2000, max_body_bytes=64 * 1024
    ) as running:
        yield running
