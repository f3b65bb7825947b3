"""Build a new, immutable pipeline version: its parts' artifacts and its manifest.

A version is never overwritten. A part whose inputs (its fingerprint) match an intact part of an
earlier version is shared, not rebuilt: retraining the forest alone leaves preprocess and bert at
their earlier part versions.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import platform
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from build_models.demo_data import make_reviews
from build_models.errors import BuildInputError
from build_models.pipeline import ReferencePipeline, part_paths
from build_models.releases import DEFAULT_RELEASE, release
from build_models.versions import (
    MANIFEST_SCHEMA,
    PARTS,
    artifacts_intact,
    list_versions,
    manifest_path,
    part_artifacts,
    read_manifest,
    sha256_file,
)

log = logging.getLogger(__name__)

__all__ = ["BuildOptions", "BuildResult", "build", "sha256_file"]


@dataclass(frozen=True)
class BuildOptions:
    """Everything that decides what the builder writes (and so goes into the fingerprint)."""

    repository: Path
    bert: str | None = None
    train_csv: Path | None = None
    demo_rows: int = 2000
    trees: int = 50
    max_depth: int = 16
    max_seq_len: int | None = None
    triton_release: str = DEFAULT_RELEASE
    seed: int = 0
    # The pipeline version to build (None: 1 + the highest built); an existing one is refused.
    version: int | None = None


def load_training_data(options: BuildOptions) -> tuple[list[str], npt.NDArray[np.float32], str]:
    """The (texts, targets, description) to train on: the CSV if given, else the demo set."""
    if options.train_csv is None:
        rows = make_reviews(options.demo_rows, seed=20241010 + options.seed)
        source = f"synthetic demo reviews (build_models.demo_data, {options.demo_rows} rows)"
    else:
        rows = _read_csv(options.train_csv)
        source = str(options.train_csv)
    if len(rows) < 10:
        raise BuildInputError(f"training data has {len(rows)} usable rows; at least 10 are needed")
    texts = [text for text, _ in rows]
    targets = np.asarray([target for _, target in rows], dtype=np.float32)
    return texts, targets, source


def _read_csv(path: Path) -> list[tuple[str, float]]:
    if not path.is_file():
        raise BuildInputError(f"training CSV {path} does not exist")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = set(reader.fieldnames or [])
        missing = {"text", "target"} - columns
        if missing:
            raise BuildInputError(
                f"training CSV {path} lacks the column(s) {', '.join(sorted(missing))}; "
                f"it has: {', '.join(sorted(columns)) or 'none'} (a header line 'text,target' is expected)"
            )
        rows = []
        for line_number, row in enumerate(reader, start=2):
            text = (row["text"] or "").strip()
            try:
                target = float(row["target"])
            except (TypeError, ValueError):
                raise BuildInputError(
                    f"{path}:{line_number}: target {row['target']!r} is not a number"
                ) from None
            if text and np.isfinite(target):
                rows.append((text, target))
    if not rows:
        raise BuildInputError(f"training CSV {path} has no rows with a text and a target")
    return rows


def _data_digest(texts: list[str], targets: npt.NDArray[np.float32]) -> str:
    digest = hashlib.sha256()
    for text, target in zip(texts, targets.tolist(), strict=True):
        digest.update(text.encode("utf-8"))
        digest.update(f"\t{target!r}\n".encode())
    return digest.hexdigest()


def _source_digest(source: Path | str) -> str:
    if isinstance(source, Path) and source.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in source.rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(source)).encode())
            digest.update(sha256_file(file).encode())
        return digest.hexdigest()
    return f"hub:{source}"


def _max_sequence_length(
    source: Path | str, tokenizer: Any, max_positions: int, asked: int | None
) -> int:
    if asked is not None:
        if not 8 <= asked <= max_positions:
            raise BuildInputError(f"--max-seq-len must lie in 8..{max_positions} for this model")
        return asked
    # sentence-transformers records the length the model was trained at; prefer it.
    st_config = Path(source) / "sentence_bert_config.json" if isinstance(source, Path) else None
    if st_config is not None and st_config.is_file():
        return int(json.loads(st_config.read_text()).get("max_seq_length", max_positions))
    return int(min(max_positions, getattr(tokenizer, "model_max_length", max_positions)))


def _digest(material: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Fingerprints:
    """What decides each part, hashed: equal fingerprints mean a part can be shared."""

    encoder: str  # preprocess (tokenizer) and bert: built together from one encoder source
    forest: str  # includes the encoder's: a forest is trained on that encoder's embeddings
    pipeline: str  # the whole version


def fingerprints(options: BuildOptions, source_digest: str, data_digest: str) -> Fingerprints:
    """The part and whole-pipeline fingerprints of a build with ``options``."""
    import torch
    import treelite

    encoder = _digest(
        {
            "source": source_digest,
            "max_seq_len": str(options.max_seq_len),
            "torch": torch.__version__,
            "triton_release": options.triton_release,
            "schema": MANIFEST_SCHEMA,
        }
    )
    forest = _digest(
        {
            "encoder": encoder,
            "data": data_digest,
            "trees": options.trees,
            "max_depth": options.max_depth,
            "seed": options.seed,
            "treelite": treelite.__version__,
        }
    )
    return Fingerprints(encoder, forest, _digest({"encoder": encoder, "forest": forest}))


@dataclass(frozen=True)
class BuildResult:
    """The pipeline version a build produced, or found already built (``built`` False)."""

    version: int
    manifest: dict[str, Any]
    built: bool


def _manifests(repository: Path) -> list[tuple[int, dict[str, Any]]]:
    return [(version, read_manifest(repository, version)) for version in list_versions(repository)]


def _up_to_date_version(
    repository: Path, manifests: list[tuple[int, dict[str, Any]]], pipeline_fingerprint: str
) -> tuple[int, dict[str, Any]] | None:
    """The newest version with exactly these inputs and untouched artifacts, if any."""
    for version, manifest in reversed(manifests):
        if manifest.get("inputs_fingerprint") == pipeline_fingerprint and artifacts_intact(
            repository, manifest.get("artifacts", {})
        ):
            return version, manifest
    return None


def _reusable_part(
    repository: Path,
    manifests: list[tuple[int, dict[str, Any]]],
    names: tuple[str, ...],
    fingerprint: str,
) -> tuple[dict[str, Any], dict[str, int]] | None:
    """A manifest whose parts ``names`` all have ``fingerprint`` and intact artifacts, and those
    part versions; the newest such manifest wins."""
    for _, manifest in reversed(manifests):
        parts = manifest.get("parts", {})
        if all(parts.get(name, {}).get("fingerprint") == fingerprint for name in names) and all(
            artifacts_intact(repository, part_artifacts(manifest, name)) for name in names
        ):
            return manifest, {name: int(parts[name]["version"]) for name in names}
    return None


def build(
    options: BuildOptions, force: bool = False, progress: Callable[[str], None] = log.info
) -> BuildResult:
    """Build a new pipeline version into ``options.repository`` and write its manifest.

    Without ``force``: when a version with exactly these inputs and intact artifacts exists,
    nothing is built and that version is returned (``built`` False); otherwise parts whose inputs
    match an intact earlier part are shared. ``force`` builds every part anew. Raises
    BuildInputError for unusable inputs and for ``options.version`` naming an existing version
    (a version is never overwritten).
    """
    started = time.perf_counter()
    release(options.triton_release)  # unknown release -> clear error before any work
    repository = options.repository
    if not (repository / "bert" / "config.pbtxt").is_file():
        raise BuildInputError(f"{repository} is not a model repository (no bert/config.pbtxt)")
    manifests = _manifests(repository)
    existing = [version for version, _ in manifests]
    if options.version is not None:
        if options.version < 1:
            raise BuildInputError(f"--version must be >= 1, got {options.version}")
        # Checked even when the whole leftover tree is absent: a manifest path alone claims N.
        if options.version in existing or manifest_path(repository, options.version).exists():
            raise BuildInputError(
                f"pipeline version {options.version} already exists in {repository}; "
                "a version is never overwritten (omit --version to build the next one)"
            )
    from build_models import encoder as encoder_module

    texts, targets, data_source = load_training_data(options)
    data_digest = _data_digest(texts, targets)
    source = encoder_module.resolve_source(options.bert)
    source_digest = _source_digest(source)
    prints = fingerprints(options, source_digest, data_digest)
    if not force:
        found = _up_to_date_version(repository, manifests, prints.pipeline)
        if found is not None:
            progress(
                f"pipeline version {found[0]} in {repository} has exactly these inputs and intact "
                "artifacts: nothing built (--force builds a new version)"
            )
            return BuildResult(found[0], found[1], built=False)
    version = options.version if options.version is not None else max(existing, default=0) + 1
    manifest = _build_version(
        options, version, manifests, prints, force, progress, (texts, targets, data_source)
    )
    manifest["build_seconds"] = round(time.perf_counter() - started, 2)
    manifest["data"]["sha256"] = data_digest
    manifest["source_digest"] = source_digest
    path = manifest_path(repository, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written last and renamed into place: a version exists only once all its parts do.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(path)
    metrics = manifest["forest"]
    progress(
        f"built pipeline version {version} in {manifest['build_seconds']} s: hold-out "
        f"R^2 {metrics['r2']:.3f}, MAE {metrics['mae']:.3f}"
    )
    return BuildResult(version, manifest, built=True)


def _build_version(
    options: BuildOptions,
    version: int,
    manifests: list[tuple[int, dict[str, Any]]],
    prints: Fingerprints,
    force: bool,
    progress: Callable[[str], None],
    data: tuple[list[str], npt.NDArray[np.float32], str],
) -> dict[str, Any]:
    """Build (or share) each part of ``version``; returns its manifest, not yet written."""
    from build_models import encoder as encoder_module
    from build_models.forest import export_checkpoint, train_forest

    repository = options.repository
    texts, targets, data_source = data
    encoder_found = (
        None
        if force
        else _reusable_part(repository, manifests, ("preprocess", "bert"), prints.encoder)
    )
    forest_found = (
        None if force else _reusable_part(repository, manifests, ("forest",), prints.forest)
    )
    parts = {
        "preprocess": version,
        "bert": version,
        "forest": forest_found[1]["forest"] if forest_found else version,
    }
    if encoder_found is not None:
        donor, shared = encoder_found
        parts.update(shared)
        progress(f"sharing preprocess v{shared['preprocess']} and bert v{shared['bert']}")
        max_len = int(donor["max_sequence_length"])
        deviation = float(donor["export_max_deviation"])
    else:
        max_len, deviation = _build_encoder(options, parts, progress)
    paths = part_paths(repository, parts)
    pipeline = ReferencePipeline(repository, version, parts=parts)
    if forest_found is not None:
        progress(f"sharing forest v{parts['forest']}")
        forest_record = dict(forest_found[0]["forest"])
        treelite_version = str(forest_found[0]["versions"]["treelite"])
    else:
        progress(f"embedding {len(texts)} training texts")
        features = np.zeros((len(texts), pipeline.dimension), dtype=np.float32)
        step = 256
        for start in range(0, len(texts), step):
            features[start : start + step] = pipeline.embed_many(texts[start : start + step])
            progress(f"  embedded {min(start + step, len(texts))}/{len(texts)}")
        progress(f"training forest ({options.trees} trees, max depth {options.max_depth})")
        forest, metrics = train_forest(
            features, targets, options.trees, options.max_depth, options.seed
        )
        treelite_version = export_checkpoint(
            forest, metrics.trainer, options.triton_release, paths["forest"]
        )
        forest_record = {"trees": options.trees, "max_depth": options.max_depth, **asdict(metrics)}

    import torch

    artifact_files = list(paths.values())
    if parts["preprocess"] > 1:
        artifact_files.append(repository / "preprocess" / str(parts["preprocess"]) / "model.py")
    part_fingerprints = {
        "preprocess": prints.encoder,
        "bert": prints.encoder,
        "forest": prints.forest,
    }
    return {
        "schema": MANIFEST_SCHEMA,
        "pipeline_version": version,
        "parts": {
            part: {"version": parts[part], "fingerprint": part_fingerprints[part]} for part in PARTS
        },
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": 0.0,  # set by build() once the whole version is done
        "inputs_fingerprint": prints.pipeline,
        "source_model": options.bert or encoder_module.DEFAULT_MODEL,
        "source_digest": "",  # set by build()
        "embedding_dimension": pipeline.dimension,
        "max_sequence_length": max_len,
        "pad_to_multiple_of": pipeline.pad_multiple,
        "export_max_deviation": deviation,
        "triton_release": options.triton_release,
        "versions": {
            "torch": torch.__version__,
            "treelite": treelite_version,
            "python": platform.python_version(),
        },
        "data": {"source": data_source, "rows": len(texts), "sha256": ""},
        "forest": forest_record,
        "artifacts": {
            str(path.relative_to(repository)): sha256_file(path) for path in artifact_files
        },
    }


def _build_encoder(
    options: BuildOptions, parts: dict[str, int], progress: Callable[[str], None]
) -> tuple[int, float]:
    """Export the TorchScript encoder and write the tokenizer (and, for a part version above 1,
    a copy of the committed preprocess model.py, so the version never changes with the code).

    Returns ``(max sequence length, export deviation)``.
    """
    from build_models import encoder as encoder_module

    repository = options.repository
    paths = part_paths(repository, parts)
    source = encoder_module.resolve_source(options.bert)
    progress(f"loading encoder {options.bert or encoder_module.DEFAULT_MODEL}")
    with warnings.catch_warnings():
        # transformers' deprecation and tracer chatter says nothing about this export's correctness,
        # which export_torchscript checks numerically.
        warnings.simplefilter("ignore")
        module, hf_tokenizer, max_positions = encoder_module.load_encoder(source)
        max_len = _max_sequence_length(source, hf_tokenizer, max_positions, options.max_seq_len)
        progress(f"exporting TorchScript (max sequence length {max_len})")
        deviation = encoder_module.export_torchscript(
            module, hf_tokenizer.vocab_size, paths["encoder"]
        )
    fast_tokenizer = hf_tokenizer.backend_tokenizer
    fast_tokenizer.no_padding()
    fast_tokenizer.enable_truncation(max_length=max_len)
    paths["tokenizer"].parent.mkdir(parents=True, exist_ok=True)
    fast_tokenizer.save(str(paths["tokenizer"]))
    if parts["preprocess"] > 1:
        shutil.copy2(
            repository / "preprocess" / "1" / "model.py",
            paths["tokenizer"].parent / "model.py",
        )
    return max_len, deviation
