"""Build every artifact of the model repository and record what was built in a manifest."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import platform
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
from build_models.pipeline import ReferencePipeline, artifact_paths
from build_models.releases import DEFAULT_RELEASE, release

log = logging.getLogger(__name__)

MANIFEST_NAME = "build-manifest.json"
MANIFEST_SCHEMA = 1


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


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def _fingerprint(options: BuildOptions, source_digest: str, data_digest: str) -> str:
    import torch
    import treelite

    material = {
        "options": {k: str(v) for k, v in asdict(options).items() if k != "repository"},
        "source": source_digest,
        "data": data_digest,
        "torch": torch.__version__,
        "treelite": treelite.__version__,
        "schema": MANIFEST_SCHEMA,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def read_manifest(repository: Path) -> dict[str, Any] | None:
    """The manifest of the last build in ``repository``, if any."""
    path = repository / MANIFEST_NAME
    if not path.is_file():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def is_up_to_date(repository: Path, fingerprint: str) -> bool:
    """True when the last build had these inputs and its artifacts are still intact."""
    manifest = read_manifest(repository)
    if manifest is None or manifest.get("inputs_fingerprint") != fingerprint:
        return False
    for relative, digest in manifest.get("artifacts", {}).items():
        path = repository / relative
        if not path.is_file() or sha256_file(path) != digest:
            return False
    return True


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


def build(
    options: BuildOptions, force: bool = False, progress: Callable[[str], None] = log.info
) -> dict[str, Any]:
    """Build tokenizer, TorchScript encoder and Treelite forest into ``options.repository``.

    Returns the manifest. With unchanged inputs and intact artifacts it does nothing (unless
    ``force``). Raises BuildInputError for unusable inputs.
    """
    from build_models import encoder as encoder_module
    from build_models.forest import export_checkpoint, train_forest

    started = time.perf_counter()
    release(options.triton_release)  # unknown release -> clear error before any work
    repository = options.repository
    if not (repository / "bert" / "config.pbtxt").is_file():
        raise BuildInputError(f"{repository} is not a model repository (no bert/config.pbtxt)")
    texts, targets, data_source = load_training_data(options)
    data_digest = _data_digest(texts, targets)
    source = encoder_module.resolve_source(options.bert)
    source_digest = _source_digest(source)
    fingerprint = _fingerprint(options, source_digest, data_digest)
    if not force and is_up_to_date(repository, fingerprint):
        progress(f"models in {repository} are up to date (inputs unchanged); --force rebuilds")
        existing = read_manifest(repository)
        assert existing is not None  # is_up_to_date() just read it
        return existing

    paths = artifact_paths(repository)
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

    pipeline = ReferencePipeline(repository)
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

    import torch

    manifest: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(time.perf_counter() - started, 2),
        "inputs_fingerprint": fingerprint,
        "source_model": options.bert or encoder_module.DEFAULT_MODEL,
        "source_digest": source_digest,
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
        "data": {"source": data_source, "rows": len(texts), "sha256": data_digest},
        "forest": {"trees": options.trees, "max_depth": options.max_depth, **asdict(metrics)},
        "artifacts": {
            str(path.relative_to(repository)): sha256_file(path) for path in paths.values()
        },
    }
    (repository / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    progress(
        f"built in {manifest['build_seconds']} s: hold-out R^2 {metrics.r2:.3f}, MAE {metrics.mae:.3f}"
    )
    return manifest
