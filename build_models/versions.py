"""Pipeline versions on disk: where each version's manifest lies, and how to read them.

A pipeline version N is recorded by ``<repository>/pipelines/<N>/manifest.json``; its ``parts``
name the part versions it is made of (``preprocess``, ``bert``, ``forest``), whose artifacts lie
in ``<repository>/<part>/<part version>/``. Served by Triton, version N is its own set of model
names (``served_names``). This module is the one place that lists versions and reads manifests.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PIPELINES_DIR = "pipelines"
MANIFEST_FILE = "manifest.json"
MANIFEST_SCHEMA = 2
PARTS = ("preprocess", "bert", "forest")
# Every served model has exactly one Triton version directory: the pipeline version is in its name.
SERVED_MODEL_VERSION = 1


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_path(repository: Path, version: int) -> Path:
    """Where the manifest of pipeline ``version`` lies in a source repository."""
    return repository / PIPELINES_DIR / str(version) / MANIFEST_FILE


def list_versions(repository: Path) -> list[int]:
    """The pipeline versions recorded in ``repository`` (those with a manifest), ascending."""
    root = repository / PIPELINES_DIR
    if not root.is_dir():
        return []
    return sorted(
        int(entry.name)
        for entry in root.iterdir()
        if entry.name.isdigit() and (entry / MANIFEST_FILE).is_file()
    )


def latest_version(repository: Path) -> int | None:
    """The highest pipeline version in ``repository``, or None when nothing is built."""
    versions = list_versions(repository)
    return versions[-1] if versions else None


def read_manifest(repository: Path, version: int) -> dict[str, Any]:
    """The manifest of pipeline ``version``; FileNotFoundError names the version when missing."""
    path = manifest_path(repository, version)
    if not path.is_file():
        raise FileNotFoundError(f"pipeline version {version} is not built in {repository}")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def part_versions(manifest: Mapping[str, Any]) -> dict[str, int]:
    """``{"preprocess": P, "bert": B, "forest": F}`` of a manifest."""
    parts = manifest["parts"]
    return {part: int(parts[part]["version"]) for part in PARTS}


def ensemble_names(version: int) -> tuple[str, str]:
    """The served names of pipeline ``version``'s ensembles: (regression, embedding)."""
    return (f"text_regression_v{int(version)}", f"text_embedding_v{int(version)}")


def served_names(version: int, parts: Mapping[str, int]) -> dict[str, str]:
    """Triton model names of pipeline ``version`` made of part versions ``parts``.

    Keys are the template names (``text_regression``, ``text_embedding``, ``preprocess``,
    ``bert``, ``forest``); values the served names (``text_regression_v2``, ``forest_v2``,
    ``bert_v1``, ...). A part shared by several versions has one served name.
    """
    names = {part: f"{part}_v{int(parts[part])}" for part in PARTS}
    names["text_regression"], names["text_embedding"] = ensemble_names(version)
    return names


def artifacts_intact(repository: Path, artifacts: Mapping[str, str]) -> bool:
    """True when every ``relative path -> sha256`` of ``artifacts`` is present and unchanged."""
    for relative, digest in artifacts.items():
        path = repository / relative
        if not path.is_file() or sha256_file(path) != digest:
            return False
    return True


def part_artifacts(manifest: Mapping[str, Any], part: str) -> dict[str, str]:
    """The artifacts (relative path -> sha256) of one part of a manifest."""
    prefix = f"{part}/{int(manifest['parts'][part]['version'])}/"
    return {
        path: digest
        for path, digest in manifest.get("artifacts", {}).items()
        if path.startswith(prefix)
    }
