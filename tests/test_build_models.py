"""The model builder's command line: validation, idempotence, manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from build_models.demo_data import make_reviews
from build_models.versions import list_versions, read_manifest
from tests.conftest import FAST_BUILD_ARGS, copy_committed_repository, run_builder


def test_help_describes_the_options() -> None:
    result = run_builder("--help")
    assert result.returncode == 0
    for option in ("--bert", "--train-csv", "--force", "--triton-release", "--version", "--list"):
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
    assert list_versions(repository) == []


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


def tree_digests(repository: Path) -> dict[str, str]:
    """SHA-256 of every file under ``repository`` (links followed), by relative path."""
    return {
        str(path.relative_to(repository)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(repository.rglob("*"))
        if path.is_file()
    }


def test_build_writes_version_1_and_building_again_builds_nothing(
    built_repository: Path,
) -> None:
    assert list_versions(built_repository) == [1]
    manifest = read_manifest(built_repository, 1)
    assert manifest["schema"] == 2 and manifest["pipeline_version"] == 1
    assert {part: record["version"] for part, record in manifest["parts"].items()} == {
        "preprocess": 1,
        "bert": 1,
        "forest": 1,
    }
    # preprocess and bert come from one encoder: one fingerprint; the forest's is its own.
    parts = manifest["parts"]
    assert parts["preprocess"]["fingerprint"] == parts["bert"]["fingerprint"]
    assert parts["forest"]["fingerprint"] != parts["bert"]["fingerprint"]
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
    before = tree_digests(built_repository)
    mtime = (built_repository / "bert" / "1" / "model.pt").stat().st_mtime_ns
    again = run_builder("--repository", str(built_repository), *FAST_BUILD_ARGS)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("pipeline version 1 up to date, nothing built")
    assert list_versions(built_repository) == [1]
    assert tree_digests(built_repository) == before
    assert (built_repository / "bert" / "1" / "model.pt").stat().st_mtime_ns == mtime


@pytest.mark.parametrize("extra", [[], ["--force"]])
def test_an_existing_version_is_never_overwritten(built_repository: Path, extra: list[str]) -> None:
    before = tree_digests(built_repository)
    # Other inputs (more trees), and even --force: version 1 stays what it is.
    refused = run_builder(
        "--repository",
        str(built_repository),
        *FAST_BUILD_ARGS,
        "--trees",
        "11",
        "--version",
        "1",
        *extra,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: pipeline version 1 already exists in {built_repository}; a version is never "
        "overwritten (omit --version to build the next one)"
    ]
    assert tree_digests(built_repository) == before
    assert list_versions(built_repository) == [1]


def test_demo_data_is_deterministic_and_long_tailed() -> None:
    first, second = make_reviews(500), make_reviews(500)
    assert first == second
    assert make_reviews(500, seed=1) != first
    lengths = sorted(len(text.split()) for text, _ in first)
    assert lengths[len(lengths) // 2] < 25 < lengths[-1]
    assert {round(target) for _, target in first} <= {1, 2, 3, 4, 5}
