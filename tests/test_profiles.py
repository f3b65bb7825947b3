"""Rendering of the servable profiles from the committed configs (no artifacts needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from build_models.profiles import COMPOSING_MODELS, ENSEMBLES, MODELS, main, read_config
from tests.conftest import ROOT

SOURCE = ROOT / "model_repository"
REAL_BACKENDS = {
    "preprocess": ("python", ""),
    "bert": ("", "pytorch_libtorch"),
    "forest": ("fil", ""),
}


def render(profile: str, destination: Path, *extra: str) -> dict[str, mc.ModelConfig]:
    """Render ``profile`` through the command line and parse every config it wrote."""
    assert (
        main(["--profile", profile, "--source", str(SOURCE), "--out", str(destination), *extra])
        == 0
    )
    return {name: read_config(destination / name / "config.pbtxt") for name in MODELS}


def test_gpu_profile_parses_and_keeps_the_real_backends_on_gpu(tmp_path: Path) -> None:
    configs = render("gpu", tmp_path / "gpu", "--instances", "bert=2")
    for name in COMPOSING_MODELS:
        config = configs[name]
        assert (config.backend, config.platform) == REAL_BACKENDS[name]
        assert [group.kind for group in config.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
    assert configs["bert"].instance_group[0].count == 2
    assert configs["preprocess"].parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "no"
    for name in ENSEMBLES:
        steps = {step.model_name for step in configs[name].ensemble_scheduling.step}
        assert configs[name].platform == "ensemble"
        assert steps <= set(COMPOSING_MODELS)


def test_gpu_image_cpu_profile_keeps_the_real_backends_on_kind_cpu(tmp_path: Path) -> None:
    destination = tmp_path / "gpu-image-cpu"
    configs = render("gpu-image-cpu", destination)
    for name in COMPOSING_MODELS:
        config = configs[name]
        assert (config.backend, config.platform) == REAL_BACKENDS[name]
        assert [group.kind for group in config.instance_group] == [mc.ModelInstanceGroup.KIND_CPU]
        assert not any(group.gpus for group in config.instance_group)
    assert configs["preprocess"].parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "yes"
    # The real backends' own parameters stay (the stand-in profile clears them).
    assert configs["forest"].parameters["model_type"].string_value == "treelite_checkpoint"
    assert configs["bert"].parameters["INFERENCE_MODE"].string_value == "true"
    # No Python stand-in is dropped next to the PyTorch and FIL models.
    assert not list((destination / "bert").rglob("model.py"))
    assert not list((destination / "forest").rglob("model.py"))


def test_cpu_profile_still_swaps_in_python_stand_ins(tmp_path: Path) -> None:
    configs = render("cpu", tmp_path / "cpu")
    assert configs["bert"].backend == "python"
    assert configs["forest"].backend == "python"
    assert configs["bert"].platform == ""


def test_unknown_profile_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--profile", "gpu-on-cpu", "--out", str(tmp_path / "x")])


def test_embedded_gpu_profile_keeps_the_encoder_on_the_gpu_and_the_forest_on_the_host(
    tmp_path: Path,
) -> None:
    configs = render("embedded-gpu", tmp_path)
    kinds = {name: {g.kind for g in configs[name].instance_group} for name in COMPOSING_MODELS}
    assert kinds == {
        "preprocess": {mc.ModelInstanceGroup.KIND_GPU},
        "bert": {mc.ModelInstanceGroup.KIND_GPU},
        "forest": {mc.ModelInstanceGroup.KIND_CPU},
    }
    assert configs["bert"].backend == configs["forest"].backend == "python"
    # GPU tensors reach the encoder as they are (DLPack), no copy to the host in between.
    assert configs["bert"].parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "no"
    assert configs["preprocess"].parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "no"
    assert [g.count for g in configs["bert"].instance_group] == [1]
