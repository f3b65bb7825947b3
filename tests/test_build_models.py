"""The model builder's command line: validation, idempotence, manifest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from build_models.demo_data import make_reviews
from tests.conftest import FAST_BUILD_ARGS, copy_committed_repository


def run_builder(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "build_models", *args], capture_output=True, text=True, timeout=300
    )


def test_help_describes_the_options() -> None:
    result = run_builder("--help")
    assert result.returncode == 0
    for option in ("--bert", "--train-csv", "--force", "--triton-release"):
        assert option in result.stdout


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [
        ("review,stars\nnice,5\n", "lacks the column(s) target, text"),
        ("text,target\n", "no rows with a text and a target"),
        ("text,target\nnice,five\n", "is not a number"),
    ],
)
def test_bad_training_csv_is_refused_with_exit_code_2(
    tmp_path: Path, csv_text: str, message: str
) -> None:
    repository = copy_committed_repository(tmp_path / "repo")
    csv_path = tmp_path / "train.csv"
    csv_path.write_text(csv_text)
    result = run_builder("--repository", str(repository), "--train-csv", str(csv_path))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (repository / "bert" / "1" / "model.pt").exists()


def test_missing_csv_and_unknown_model_are_refused(tmp_path: Path) -> None:
    repository = copy_committed_repository(tmp_path / "repo")
    missing = run_builder(
        "--repository", str(repository), "--train-csv", str(tmp_path / "nope.csv")
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    unknown = run_builder(
        "--repository", str(repository), "--bert", str(not_a_model), "--demo-rows", "20"
    )
    assert unknown.returncode == 2 and "cannot load a BERT encoder" in unknown.stderr


def test_build_writes_manifest_and_is_idempotent(built_repository: Path) -> None:
    manifest = json.loads((built_repository / "build-manifest.json").read_text())
    assert manifest["embedding_dimension"] == 384
    assert manifest["max_sequence_length"] == 256
    assert manifest["versions"]["treelite"] == "4.3.0"
    assert manifest["export_max_deviation"] <= 1e-5
    assert manifest["data"]["rows"] == 300
    assert set(manifest["artifacts"]) == {
        "preprocess/1/tokenizer.json",
        "bert/1/model.pt",
        "forest/1/checkpoint.tl",
    }
    assert -1.0 <= manifest["forest"]["r2"] <= 1.0 and manifest["forest"]["mae"] >= 0
    before = (built_repository / "bert" / "1" / "model.pt").stat().st_mtime_ns
    again = run_builder("--repository", str(built_repository), *FAST_BUILD_ARGS)
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stderr
    assert (built_repository / "bert" / "1" / "model.pt").stat().st_mtime_ns == before


def test_demo_data_is_deterministic_and_long_tailed() -> None:
    first, second = make_reviews(500), make_reviews(500)
    assert first == second
    assert make_reviews(500, seed=1) != first
    lengths = sorted(len(text.split()) for text, _ in first)
    assert lengths[len(lengths) // 2] < 25 < lengths[-1]
    assert {round(target) for _, target in first} <= {1, 2, 3, 4, 5}
