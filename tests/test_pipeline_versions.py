"""Pipeline versions side by side: a second version shares the unchanged parts, the renderer adds
it to a repository that a real Triton is serving, and both versions answer under their own names.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from build_models.pipeline import ReferencePipeline
from build_models.profiles import render_models, render_repository
from build_models.versions import list_versions, read_manifest
from devtools.triton import EmbeddedTriton
from tests.conftest import FAST_BUILD_ARGS, TEXTS, run_builder, wait_for
from tests.test_triton_pipeline import infer


@pytest.fixture(scope="module")
def two_versions(built_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session's repository (version 1) plus version 2: the forest with 12 trees."""
    repository = tmp_path_factory.mktemp("two-versions") / "repository"
    shutil.copytree(built_repository, repository, symlinks=True)
    built = run_builder("--repository", str(repository), *FAST_BUILD_ARGS, "--trees", "12")
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip().splitlines()[-1] == (
        "pipeline version 2 built (preprocess v1, bert v1, forest v2)"
    )
    return repository


def test_retraining_the_forest_alone_shares_preprocess_and_bert(two_versions: Path) -> None:
    assert list_versions(two_versions) == [1, 2]
    manifest = read_manifest(two_versions, 2)
    first = read_manifest(two_versions, 1)
    assert manifest["pipeline_version"] == 2 and manifest["forest"]["trees"] == 12
    assert {part: record["version"] for part, record in manifest["parts"].items()} == {
        "preprocess": 1,
        "bert": 1,
        "forest": 2,
    }
    assert manifest["parts"]["bert"] == first["parts"]["bert"]
    assert manifest["parts"]["forest"]["fingerprint"] != first["parts"]["forest"]["fingerprint"]
    # Nothing of the encoder was written again; the new forest has its own directory.
    assert not (two_versions / "bert" / "2").exists()
    assert not (two_versions / "preprocess" / "2").exists()
    assert set(manifest["artifacts"]) == {
        "preprocess/1/tokenizer.json",
        "bert/1/model.pt",
        "forest/2/checkpoint.tl",
    }
    listed = run_builder("--repository", str(two_versions), "--list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.strip().splitlines()]
    assert rows[0][:4] == ["version", "preprocess", "bert", "forest"]
    assert [row[:4] for row in rows[1:]] == [["1", "v1", "v1", "v1"], ["2", "v1", "v1", "v2"]]


def test_a_new_version_is_added_to_a_serving_triton_and_both_answer(
    two_versions: Path, built_repository: Path, tmp_path: Path
) -> None:
    served = render_repository(tmp_path / "served", "cpu", built_repository)
    assert sorted(p.name for p in served.iterdir()) == [
        "bert_v1",
        "forest_v1",
        "preprocess_v1",
        "text_embedding_v1",
        "text_regression_v1",
    ]
    # Nothing of a served model changes when Triton loads it (the Python backend finds no place
    # for its __pycache__) or when a version is added: Triton would reload it, and its ensembles.
    existing = {
        path: (path.stat().st_ino, path.stat().st_mtime_ns)
        for name in ("bert_v1", "forest_v1", "text_regression_v1")
        for path in (served / name, served / name / "config.pbtxt", served / name / "1")
    }
    with EmbeddedTriton(served, tmp_path / "triton") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        v1_scores = infer(client, "text_regression_v1", TEXTS, "score")
        added = render_models(served, "cpu", two_versions, additive=True)
        # Only version 2's own models: preprocess_v1 and bert_v1 are shared and already there.
        assert sorted(added) == ["forest_v2", "text_embedding_v2", "text_regression_v2"]
        assert {
            path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in existing
        } == existing
        assert not [p.name for p in served.iterdir() if p.name.startswith(".")]
        for name in ("text_regression_v2", "text_embedding_v2"):
            client.load_model(name)
        wait_for(lambda: client.is_model_ready("text_regression_v2"), what="version 2 ready")
        v2_scores = infer(client, "text_regression_v2", TEXTS, "score")
        embeddings = {
            version: infer(client, f"text_embedding_v{version}", TEXTS, "embedding")
            for version in (1, 2)
        }
        # Version 1 still answers as before while version 2 serves next to it.
        np.testing.assert_array_equal(
            infer(client, "text_regression_v1", TEXTS, "score"), v1_scores
        )
        config = client.get_model_config("text_regression_v2", as_json=True)["config"]
        log = server.log_path.read_text()
    # Loading version 2 reused the serving encoder and version 1's ensembles as they were.
    assert log.count('"loading: bert_v1:1"') == 1, log[-3000:]
    assert log.count('"loading: text_regression_v1:1"') == 1, log[-3000:]
    # The forest differs, the shared encoder does not.
    assert not np.allclose(v1_scores, v2_scores, atol=1e-4)
    np.testing.assert_array_equal(embeddings[1], embeddings[2])
    reference = ReferencePipeline(two_versions, version=2)
    np.testing.assert_allclose(v2_scores.reshape(-1), reference.score(TEXTS), atol=1e-4, rtol=0)
    parameters = {key: value["string_value"] for key, value in config["parameters"].items()}
    assert parameters["pipeline_version"] == "2"
    assert json.loads(parameters["pipeline_manifest"]) == read_manifest(two_versions, 2)
    assert [step["model_name"] for step in config["ensemble_scheduling"]["step"]] == [
        "preprocess_v1",
        "bert_v1",
        "forest_v2",
    ]


def test_a_fresh_render_replaces_the_destination(two_versions: Path, tmp_path: Path) -> None:
    destination = tmp_path / "served"
    destination.mkdir()
    (destination / "stale_v9").mkdir()
    render_repository(destination, "cpu", two_versions)
    assert not (destination / "stale_v9").exists()
    assert (destination / "forest_v2" / "1" / "checkpoint.tl").resolve() == (
        two_versions / "forest" / "2" / "checkpoint.tl"
    ).resolve()
    assert os.path.islink(destination / "bert_v1" / "1" / "model.pt")
