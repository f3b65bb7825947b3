"""A deliberately bad pipeline version, for rollout drills in tests and benchmarks.

:func:`add_faulty_version` adds pipeline version N to a *served* (rendered, CPU-profile)
repository: version ``base``'s preprocess and encoder, and a forest that wraps ``base``'s forest
stand-in with a fault: ``error`` (every request fails) or ``slow`` (every execution sleeps
``delay_s`` first). The fault is off until the file :func:`add_faulty_version` returns exists, so
the version loads and warms up like a good one and goes bad when the drill says. Nothing is built
or trained: the version exists only in the served repository.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from build_models.profiles import read_config, write_config, write_pipeline_ensembles
from build_models.versions import part_versions, read_manifest

FAULTY_FOREST = '''"""A forest stand-in with an injected fault (devtools/faulty_version.py)."""

import importlib.util
import json
import os
import time

import triton_python_backend_utils as pb_utils

_spec = importlib.util.spec_from_file_location(
    "healthy_forest", os.path.join(os.path.dirname(__file__), "healthy_forest.py")
)
_healthy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_healthy)


class TritonPythonModel(_healthy.TritonPythonModel):
    def initialize(self, args):
        super().initialize(args)
        parameters = json.loads(args["model_config"])["parameters"]
        self.fault = parameters["fault"]["string_value"]
        self.delay_s = float(parameters["fault_delay_s"]["string_value"])
        self.switch = parameters["fault_switch"]["string_value"]

    def execute(self, requests):
        if os.path.exists(self.switch):
            if self.fault == "slow":
                time.sleep(self.delay_s)
            else:
                error = pb_utils.TritonError("injected fault: this forest fails every request")
                return [pb_utils.InferenceResponse(error=error) for _ in requests]
        return super().execute(requests)
'''


def add_faulty_version(
    served: Path,
    source: Path,
    base: int,
    version: int,
    fault: str = "error",
    delay_s: float = 0.5,
) -> Path:
    """Add pipeline ``version`` (a faulty copy of ``base``) to the served repository ``served``
    rendered from ``source``; load it through the gateway like any other version. Returns the
    switch: the fault is on while that file exists."""
    if fault not in ("error", "slow"):
        raise ValueError(f"fault must be 'error' or 'slow', not {fault!r}")
    manifest = read_manifest(source, base)
    parts = part_versions(manifest)
    healthy = served / f"forest_v{parts['forest']}"
    name = f"forest_v{version}"
    switch = served.parent / f"fault-on-v{version}"
    switch.unlink(missing_ok=True)
    staging = served / f".{name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(healthy, staging, symlinks=True)
    config = read_config(staging / "config.pbtxt")
    config.name = name
    for key, value in (
        ("fault", fault),
        ("fault_delay_s", str(delay_s)),
        ("fault_switch", str(switch)),
    ):
        config.parameters[key].string_value = value
    write_config(config, staging / "config.pbtxt")
    model_dir = staging / "1"
    (model_dir / "model.py").rename(model_dir / "healthy_forest.py")
    (model_dir / "model.py").write_text(FAULTY_FOREST)
    staging.rename(served / name)
    # The manifest says what it is: a reader of the admin API sees the fault.
    faulty_manifest = {**manifest, "pipeline_version": version, "fault": fault}
    faulty_manifest["parts"] = {**manifest["parts"], "forest": {"version": version}}
    write_pipeline_ensembles(
        served, version, {**parts, "forest": version}, faulty_manifest, "cpu", source
    )
    return switch
