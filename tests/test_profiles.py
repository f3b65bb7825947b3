"""Rendering of the servable profiles from the committed configs (no artifacts needed: the
pipeline versions rendered here are manifests alone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from build_models.profiles import (
    COMPOSING_MODELS,
    ENSEMBLES,
    MODELS,
    main,
    read_config,
    render_models,
    served_names,
    write_pipeline_ensembles,
)
from build_models.versions import manifest_path
from tests.conftest import copy_committed_repository

V1 = {"preprocess": 1, "bert": 1, "forest": 1}


def add_version(source: Path, version: int, parts: dict[str, int], dimension: int = 384) -> Any:
    """Record pipeline ``version`` in ``source`` by its manifest alone (no artifacts)."""
    manifest = {
        "schema": 2,
        "pipeline_version": version,
        "parts": {part: {"version": v, "fingerprint": f"fp{v}"} for part, v in parts.items()},
        "embedding_dimension": dimension,
        "artifacts": {},
    }
    path = manifest_path(source, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return manifest


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """The committed templates with pipeline version 1 recorded."""
    repository = copy_committed_repository(tmp_path / "source")
    add_version(repository, 1, V1)
    return repository


REAL_BACKENDS = {
    "preprocess": ("python", ""),
    "bert": ("", "pytorch_libtorch"),
    "forest": ("fil", ""),
}


def render(source: Path, profile: str, destination: Path, *extra: str) -> dict[str, mc.ModelConfig]:
    """Render ``profile`` through the command line and parse version 1's configs, by template
    name."""
    assert (
        main(["--profile", profile, "--source", str(source), "--out", str(destination), *extra])
        == 0
    )
    names = served_names(1, V1)
    return {name: read_config(destination / names[name] / "config.pbtxt") for name in MODELS}


def test_gpu_profile_parses_and_keeps_the_real_backends_on_gpu(
    source: Path, tmp_path: Path
) -> None:
    configs = render(source, "gpu", tmp_path / "gpu", "--instances", "bert=2")
    for name in COMPOSING_MODELS:
        config = configs[name]
        assert (config.backend, config.platform) == REAL_BACKENDS[name]
        assert [group.kind for group in config.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
    assert configs["bert"].instance_group[0].count == 2
    assert configs["preprocess"].parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "no"
    for name in ENSEMBLES:
        steps = {step.model_name for step in configs[name].ensemble_scheduling.step}
        assert configs[name].platform == "ensemble"
        assert steps == {f"{m}_v1" for m in COMPOSING_MODELS} - (
            {"forest_v1"} if name == "text_embedding" else set()
        )
        assert {s.model_version for s in configs[name].ensemble_scheduling.step} == {1}


def test_gpu_image_cpu_profile_keeps_the_real_backends_on_kind_cpu(
    source: Path, tmp_path: Path
) -> None:
    destination = tmp_path / "gpu-image-cpu"
    configs = render(source, "gpu-image-cpu", destination)
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


def test_cpu_profile_still_swaps_in_python_stand_ins(source: Path, tmp_path: Path) -> None:
    configs = render(source, "cpu", tmp_path / "cpu")
    assert configs["bert"].backend == "python"
    assert configs["forest"].backend == "python"
    assert configs["bert"].platform == ""


def test_unknown_profile_is_refused(source: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--profile", "gpu-on-cpu", "--out", str(tmp_path / "x")])


def test_embedded_gpu_profile_keeps_the_encoder_on_the_gpu_and_the_forest_on_the_host(
    source: Path, tmp_path: Path
) -> None:
    configs = render(source, "embedded-gpu", tmp_path / "embedded-gpu")
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


def test_served_names_carry_the_pipeline_and_part_versions() -> None:
    assert served_names(3, {"preprocess": 1, "bert": 2, "forest": 3}) == {
        "text_regression": "text_regression_v3",
        "text_embedding": "text_embedding_v3",
        "preprocess": "preprocess_v1",
        "bert": "bert_v2",
        "forest": "forest_v3",
    }


def test_nothing_built_is_refused_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = copy_committed_repository(tmp_path / "empty")
    assert main(["--profile", "cpu", "--source", str(empty), "--out", str(tmp_path / "x")]) == 2
    assert "no pipeline version is built" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_additive_render_adds_missing_models_and_leaves_existing_ones(
    source: Path, tmp_path: Path
) -> None:
    destination = tmp_path / "served"
    assert main(["--profile", "cpu", "--source", str(source), "--out", str(destination)]) == 0
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in destination.rglob("*")}
    add_version(source, 2, {"preprocess": 1, "bert": 1, "forest": 2}, dimension=384)
    added = render_models(destination, "cpu", source, additive=True)
    assert sorted(added) == ["forest_v2", "text_embedding_v2", "text_regression_v2"]
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in before} == before
    # Again: everything is there, nothing is written.
    assert render_models(destination, "cpu", source, additive=True) == []
    assert not [p for p in destination.iterdir() if p.name.startswith(".")]


def test_a_version_can_be_fabricated_from_its_ensembles(source: Path, tmp_path: Path) -> None:
    destination = tmp_path / "served"
    manifest = {"pipeline_version": 7, "embedding_dimension": 384, "note": "fabricated"}
    parts = {"preprocess": 1, "bert": 1, "forest": 9}
    written = write_pipeline_ensembles(destination, 7, parts, manifest, "cpu", source)
    assert written == ["text_regression_v7", "text_embedding_v7"]
    config = read_config(destination / "text_regression_v7" / "config.pbtxt")
    assert [step.model_name for step in config.ensemble_scheduling.step] == [
        "preprocess_v1",
        "bert_v1",
        "forest_v9",
    ]
    assert config.parameters["pipeline_version"].string_value == "7"
    assert json.loads(config.parameters["pipeline_manifest"].string_value) == manifest
    assert (destination / "text_embedding_v7" / "1").is_dir()
    # Written once: a second call leaves them as they are.
    assert write_pipeline_ensembles(destination, 7, parts, manifest, "cpu", source) == []
