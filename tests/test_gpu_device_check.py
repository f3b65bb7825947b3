"""The GPU check for a bare CUDA host, as far as a machine without a GPU can check it.

- The dry run of ``tests/gpu/device_check.sh`` passes here and writes the full JSON shape, every
  GPU phase skipped with its reason.
- The bundle's size: building it needs the network and minutes, so this does NOT rebuild it. It
  checks the manifest of the last real build (``load/gpu/bundle-manifest.json``, committed): that
  it was built from the current recipe (same members, versions and trimming rules), and that its
  archive plus today's working tree fit the 64 MiB a device run carries. A bundle built here
  (``.bundle/``) is checked too, file by file.
- The trimming rules on file names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from load.gpu import bundle
from load.gpu.check import PHASES, Plan, new_result
from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "gpu" / "device_check.sh"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("device-check")
    run = subprocess.run(
        [str(SCRIPT), "--dry-run", "--out", str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result: dict[str, object] = json.loads((out / "device-check.json").read_text())
    return result


def test_dry_run_skips_every_gpu_phase_with_its_reason(dry_run: dict[str, object]) -> None:
    assert dry_run["mode"] == "dry-run" and dry_run["schema"] == 1
    phases = dry_run["phases"]
    assert isinstance(phases, dict)
    assert {phase: set(shapes) for phase, shapes in phases.items()} == {
        phase: set(shapes) for phase, shapes in PHASES.items()
    }
    for shapes in phases.values():
        for entry in shapes.values():
            assert entry["status"] == "skipped"
            assert entry["reason"].startswith("dry run, a GPU-only phase: --dry-run")
    assert isinstance(dry_run["summary"], list) and len(dry_run["summary"]) == sum(
        len(shapes) for shapes in PHASES.values()
    )


def test_dry_run_records_the_environment_and_what_a_cpu_can_check(
    dry_run: dict[str, object],
) -> None:
    environment = dry_run["environment"]
    assert isinstance(environment, dict)
    assert environment["python"] and "numpy" in environment["packages"]
    assert environment["cupy"].startswith(("ok", "unavailable: transport cuda_shm"))
    checks = dry_run["dry_run_checks"]
    assert isinstance(checks, dict)
    # preprocess and bert on KIND_GPU (1), the forest on KIND_CPU (2).
    assert checks["embedded_gpu_profile"] == {"preprocess": [1], "bert": [1], "forest": [2]}
    assert checks["bundle"]["fits"] and checks["bundle"]["recipe_matches"]


def test_the_json_shape_is_the_same_in_every_mode() -> None:
    plan = Plan()
    dry, gpu = new_result("dry-run", "no GPU", plan, 1.0), new_result("gpu", None, plan, 1.0)
    assert dry.keys() == gpu.keys()
    assert json.dumps(dry["phases"], sort_keys=True) == json.dumps(gpu["phases"], sort_keys=True)


# --- the bundle -----------------------------------------------------------------------------------


def committed_manifest() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(bundle.COMMITTED_MANIFEST.read_text())
    return loaded


def test_the_committed_manifest_is_of_the_current_recipe() -> None:
    manifest = committed_manifest()
    assert manifest["recipe_sha256"] == bundle.recipe_sha256(), (
        "the bundle's recipe changed: run `python -m load.gpu.bundle build` (network) and "
        "commit load/gpu/bundle-manifest.json"
    )
    members = manifest["members"]
    assert isinstance(members, list)
    assert [(m["name"], m["version"]) for m in members] == [
        (m.name, m.version) for m in (*bundle.MEMBERS, bundle.MINILM)
    ]


def test_the_bundle_and_the_working_tree_fit_one_device_run() -> None:
    manifest = committed_manifest()
    accounting = bundle.budget(manifest, bundle.tree_bytes())
    files = manifest["files"]
    assert isinstance(files, list) and [f["name"] for f in files] == [bundle.ARCHIVE]
    assert accounting["bundle_bytes"] == sum(f["bytes"] for f in files)
    assert accounting["limit_bytes"] == 64 * 1024 * 1024
    assert accounting["fits"], accounting


def test_a_bundle_built_here_matches_its_manifest_and_fits() -> None:
    built = ROOT / ".bundle" / bundle.MANIFEST
    if not built.is_file():
        pytest.skip("no bundle built here (python -m load.gpu.bundle build)")
    manifest = json.loads(built.read_text())
    for entry in manifest["files"]:
        assert (built.parent / entry["name"]).stat().st_size == entry["bytes"]
    assert bundle.budget(manifest, bundle.tree_bytes())["fits"]


@pytest.mark.parametrize(
    ("member", "path", "kept"),
    [
        (bundle.PYTRITON, "pytriton/tritonserver/bin/tritonserver", True),
        (bundle.PYTRITON, "pytriton/tritonserver/backends/python/libtriton_python.so", True),
        (bundle.PYTRITON, "pytriton/tritonserver/python_backend_stubs/3.12/stub", True),
        (bundle.PYTRITON, "pytriton/tritonserver/python_backend_stubs/3.11/stub", False),
        (bundle.PYTRITON, "nvidia_pytriton.libs/libtritonserver-717102f0.so", True),
        (bundle.PYTRITON, "nvidia_pytriton.libs/libpython3-419a3a08.13.so.1.0", False),
        (bundle.PYTRITON, "pytriton/client/client.py", False),
        (bundle.PYTRITON, "pytriton/__init__.py", True),
        (bundle.Member("tritonclient", "2.51.0"), "tritonclient/grpc/aio/__init__.py", True),
        (bundle.Member("tritonclient", "2.51.0"), "tritonclient/http/_client.py", False),
        (bundle.STUB_NUMPY, "numpy/core/tests/test_api.py", False),
        (bundle.STUB_NUMPY, "numpy/core/_multiarray_umath.cpython-312-x86_64-linux-gnu.so", True),
        (bundle.Member("pydantic", "2.14.4"), "pydantic/__pycache__/main.cpython-312.pyc", False),
    ],
)
def test_trimming_rules(member: bundle.Member, path: str, kept: bool) -> None:
    assert bundle.keep(member, path) is kept


def test_wheel_data_lands_where_pip_puts_it() -> None:
    assert bundle.installed_path("tritonclient-2.51.0.data/purelib/tritonclient/x.py") == (
        "tritonclient/x.py"
    )
    assert bundle.installed_path("pkg-1.data/platlib/pkg/_c.so") == "pkg/_c.so"
    # perf_analyzer (40 MB) is wheel data: not a package file.
    assert bundle.installed_path("tritonclient-2.51.0.data/data/bin/perf_analyzer") is None
    assert bundle.installed_path("pydantic/main.py") == "pydantic/main.py"


def test_install_refuses_another_python(tmp_path: Path) -> None:
    (tmp_path / bundle.MANIFEST).write_text(json.dumps({"python": "2.7", "files": []}))
    with pytest.raises(RuntimeError, match=r"Python 2\.7"):
        bundle.install(tmp_path, tmp_path / "into")


def test_when_the_gpu_profile_cannot_serve_cuda_shm_is_still_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The orchestration, with fakes for the server and the measurements: the embedded-gpu
    server fails to start, so the served phases fail with the reason, the transports are measured
    against the CPU profile instead, and the baseline (no server) still runs."""
    from contextlib import contextmanager

    from load.gpu import check
    from load.gpu.models import MINILM

    started: list[str] = []

    @contextmanager
    def served(repository: Path, work: Path, profile: str, *rest: object) -> Iterator[object]:
        started.append(profile)
        if profile == "embedded-gpu":
            raise RuntimeError("model 'bert' failed to load: no CUDA")
        yield object()

    monkeypatch.setattr(check, "served", served)
    monkeypatch.setattr(check, "transports_phase", lambda server, plan, cuda: {"cuda": cuda})
    monkeypatch.setattr(check, "baseline_phase", lambda repository, device, plan: {"on": device})
    run = check.Run(tmp_path, "gpu", budget_s=600)
    run.result = check.new_result("gpu", None, check.Plan(), 600)
    check.run_shape(run, MINILM, tmp_path, tmp_path, check.Plan(), True, None)

    phases = run.result["phases"]
    assert started == ["embedded-gpu", "cpu"]
    for phase in ("pipeline", "batch512", "realistic"):
        assert phases[phase]["minilm"]["status"] == "failed"
        assert "no CUDA" in phases[phase]["minilm"]["error"]
    assert phases["transports"]["minilm"]["status"] == "ok"
    assert phases["transports"]["minilm"]["cuda"] is True
    assert phases["transports"]["minilm"]["server_profile"].startswith("cpu (the embedded-gpu")
    assert phases["baseline"]["minilm"]["status"] == "ok"
    assert phases["baseline"]["minilm"]["on"] == "cuda:0"
    assert json.loads((tmp_path / "device-check.json").read_text())["phases"] == phases
