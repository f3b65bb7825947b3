"""Render a servable model repository from the committed configs and built artifacts.

Profiles:

- ``gpu``: the committed ``config.pbtxt`` files as they are (NGC Triton image, KIND_GPU).
- ``gpu-image-cpu``: the NGC Triton image on a machine without a GPU (docker-compose.cpu.yml):
  the same PyTorch and FIL backends, every instance on KIND_CPU, and preprocess asks for its
  inputs in host memory.
- ``cpu``: the embedded server of the ``nvidia-pytriton`` wheel, which has no PyTorch or FIL
  backend. Every tensor name, type and shape is kept; only how ``bert`` and ``forest`` run changes:
  the Python backend executes the same ``model.pt`` (torch.jit) and ``checkpoint.tl`` (Treelite
  GTIL) on KIND_CPU.
- ``embedded-gpu``: that embedded server on a GPU host with no Docker (the GPU check,
  ``tests/gpu/device_check.sh``): ``preprocess`` and the ``bert`` stand-in on KIND_GPU (tensors stay
  on the GPU, handed on by DLPack; the encoder runs on CUDA), the ``forest`` stand-in on KIND_CPU
  (Treelite's GTIL has no GPU code; the FIL backend that runs it on the GPU is not in the wheel).

Every pipeline version built in the source repository is served under its own model names
(``text_regression_vN`` steps through ``preprocess_vP``, ``bert_vB``, ``forest_vF``; see
``build_models.versions``), each with one Triton version ``1/``. Artifacts are linked, not copied.
Rendering also applies each version's embedding width and per-model instance counts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from build_models.pipeline import DEFAULT_REPOSITORY
from build_models.versions import (
    SERVED_MODEL_VERSION,
    list_versions,
    part_versions,
    read_manifest,
    served_names,
)

__all__ = [
    "COMPOSING_MODELS",
    "ENSEMBLES",
    "MODELS",
    "render_config",
    "render_models",
    "render_part",
    "render_repository",
    "render_version",
    "served_names",
    "write_pipeline_ensembles",
]

# Template names: the committed configs. Served names carry versions (``served_names``).
COMPOSING_MODELS = ("preprocess", "bert", "forest")
ENSEMBLES = ("text_regression", "text_embedding")
MODELS = COMPOSING_MODELS + ENSEMBLES
CPU_STAND_INS = Path(__file__).resolve().parent / "cpu_models"
PROFILES = ("gpu", "gpu-image-cpu", "cpu", "embedded-gpu")
# Profiles whose bert and forest run in Python-backend stand-ins instead of the real backends.
STAND_IN_PROFILES = ("cpu", "embedded-gpu")


def read_config(path: Path) -> mc.ModelConfig:
    """Parse a ``config.pbtxt`` (protobuf text format) into a ModelConfig."""
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def write_config(config: mc.ModelConfig, path: Path) -> None:
    """Write a ModelConfig as ``config.pbtxt``."""
    path.write_text(text_format.MessageToString(config))


def _set_parameter(config: mc.ModelConfig, key: str, value: str) -> None:
    config.parameters[key].string_value = value


def _to_kind_cpu(config: mc.ModelConfig) -> None:
    for group in config.instance_group:
        group.kind = mc.ModelInstanceGroup.KIND_CPU
        del group.gpus[:]
    if config.name == "preprocess":
        # With no GPU, Triton must hand execute() host tensors (cupy is never imported then).
        _set_parameter(config, "FORCE_CPU_ONLY_INPUT_TENSORS", "yes")


# Measured on the 2-core machine (docs/benchmarks.md): single-threaded encoder instances, one per
# core, serve concurrent traffic faster than one instance using every core, because short texts
# leave a multi-threaded torch mostly waiting on its own threads.
CPU_ENCODER_THREADS = 1


def cpu_encoder_instances() -> int:
    """Encoder instances of the CPU profile: one per core, between 2 and 8."""
    return max(2, min(os.cpu_count() or 2, 8))


def _to_python_stand_ins(config: mc.ModelConfig, torch_threads: int | None, gpu: bool) -> None:
    if config.name in ("bert", "forest"):
        config.ClearField("platform")
        config.backend = "python"
        for key in list(config.parameters):
            del config.parameters[key]
        if config.name == "bert" and gpu:
            # The stand-in takes preprocess's GPU tensors as they are (DLPack), no host copy.
            _set_parameter(config, "FORCE_CPU_ONLY_INPUT_TENSORS", "no")
        elif config.name == "bert":
            threads = CPU_ENCODER_THREADS if torch_threads is None else torch_threads
            _set_parameter(config, "torch_num_threads", str(threads))
            for group in config.instance_group:
                group.count = cpu_encoder_instances()
        if config.name == "forest" and gpu:
            # GTIL runs on the host: Triton hands the embeddings over in host memory.
            for group in config.instance_group:
                group.kind = mc.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]


def _apply_dimension(config: mc.ModelConfig, dimension: int) -> None:
    for tensor in (*config.input, *config.output):
        if tensor.name in ("embedding", "input__0") and tensor.data_type == mc.TYPE_FP32:
            del tensor.dims[:]
            tensor.dims.append(dimension)
    for warmup in config.model_warmup:
        for name, value in warmup.inputs.items():
            if name == "input__0":
                del value.dims[:]
                value.dims.append(dimension)


def render_config(
    config: mc.ModelConfig,
    profile: str,
    dimension: int | None = None,
    instances: Mapping[str, int] | None = None,
    torch_threads: int | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
) -> mc.ModelConfig:
    """Return a copy of ``config`` rendered for ``profile``.

    ``overrides`` sets extra string parameters per model (e.g. ``{"preprocess": {"tensor_library":
    "torch_dlpack"}}``); ``instances`` sets each model's instance count.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {PROFILES}")
    rendered = mc.ModelConfig()
    rendered.CopyFrom(config)
    if profile in ("cpu", "gpu-image-cpu"):
        _to_kind_cpu(rendered)
    if profile in STAND_IN_PROFILES:
        _to_python_stand_ins(rendered, torch_threads, gpu=profile == "embedded-gpu")
    if dimension is not None:
        _apply_dimension(rendered, dimension)
    if instances and rendered.name in instances:
        for group in rendered.instance_group:
            group.count = instances[rendered.name]
    for key, value in (overrides or {}).get(rendered.name, {}).items():
        _set_parameter(rendered, key, value)
    return rendered


# See render_part: a file where Python would create its bytecode directory.
PYCACHE_BLOCKER = "__pycache__"


def _write_model_dir(destination: Path, name: str, fill: Callable[[Path], None]) -> bool:
    """Create model directory ``name`` in ``destination`` unless it exists; False if it did.

    The directory is filled under a hidden temporary name and renamed into place, so a Triton
    serving ``destination`` never sees a half-written model. An existing one is never touched.
    """
    target = destination / name
    if target.exists():
        return False
    tmp = destination / f".{name}.rendering-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a render of this process that failed half-way
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def render_part(
    destination: Path,
    part: str,
    part_version: int,
    profile: str,
    source: Path = DEFAULT_REPOSITORY,
    dimension: int | None = None,
    instances: Mapping[str, int] | None = None,
    torch_threads: int | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
) -> bool:
    """Write the served model ``<part>_v<part_version>`` into ``destination`` unless it exists.

    Its config is the committed template of ``part`` rendered for ``profile`` (``instances`` and
    ``overrides`` keyed by the template name); its one Triton version ``1/`` links the artifacts
    of ``source/<part>/<part_version>/`` and copies model.py files. Returns True when written.
    """
    name = f"{part}_v{part_version}"
    config = render_config(
        read_config(source / part / "config.pbtxt"),
        profile,
        dimension,
        instances,
        torch_threads,
        overrides,
    )
    config.name = name
    artifacts = source / part / str(part_version)

    def fill(model_dir: Path) -> None:
        write_config(config, model_dir / "config.pbtxt")
        out_version = model_dir / str(SERVED_MODEL_VERSION)
        out_version.mkdir()
        if artifacts.is_dir():
            for item in sorted(artifacts.iterdir()):
                if item.name == ".gitkeep" or item.suffix == ".tmp":
                    continue
                if item.suffix == ".py":
                    # Copied: Triton imports it from here, and a link would follow later edits.
                    shutil.copy2(item, out_version / item.name)
                else:
                    (out_version / item.name).symlink_to(item.resolve())
        if profile in STAND_IN_PROFILES and part in ("bert", "forest"):
            shutil.copy2(CPU_STAND_INS / f"{part}.py", out_version / "model.py")
        if (out_version / "model.py").exists():
            # Triton reloads a model whose files are newer than its last load, and every ensemble
            # using it. The Python backend's stub writes model.py's bytecode into __pycache__/ at
            # load (PYTHONDONTWRITEBYTECODE does not reach its interpreter), so the next load of
            # any version sharing this model would reload the serving one (measured: it wedged
            # Triton under load). A plain file of that name leaves Python nowhere to write.
            (out_version / PYCACHE_BLOCKER).write_bytes(b"")

    return _write_model_dir(destination, name, fill)


def write_pipeline_ensembles(
    destination: Path,
    version: int,
    parts: Mapping[str, int],
    manifest: Mapping[str, Any] | None,
    profile: str,
    source: Path = DEFAULT_REPOSITORY,
) -> list[str]:
    """Write pipeline ``version``'s two ensembles (``text_regression_vN``, ``text_embedding_vN``)
    into ``destination``, their steps naming the composing models of ``parts``; existing ones
    are left alone. Returns the names written.

    The configs carry the string parameters ``pipeline_version`` ("N") and ``pipeline_manifest``
    (``manifest`` as compact JSON; omitted when ``manifest`` is None). The composing models must
    be rendered separately (``render_part``), or fabricated by a test.
    """
    names = served_names(version, parts)
    dimension = None if manifest is None else int(manifest["embedding_dimension"])
    written = []
    for ensemble in ENSEMBLES:
        config = render_config(read_config(source / ensemble / "config.pbtxt"), profile, dimension)
        config.name = names[ensemble]
        for step in config.ensemble_scheduling.step:
            step.model_name = names[step.model_name]
            step.model_version = SERVED_MODEL_VERSION
        _set_parameter(config, "pipeline_version", str(version))
        if manifest is not None:
            _set_parameter(config, "pipeline_manifest", json.dumps(manifest, separators=(",", ":")))

        def fill(model_dir: Path, config: mc.ModelConfig = config) -> None:
            write_config(config, model_dir / "config.pbtxt")
            (model_dir / str(SERVED_MODEL_VERSION)).mkdir()

        if _write_model_dir(destination, names[ensemble], fill):
            written.append(names[ensemble])
    return written


def render_version(
    destination: Path,
    version: int,
    parts: Mapping[str, int],
    profile: str,
    manifest: Mapping[str, Any] | None = None,
    source: Path = DEFAULT_REPOSITORY,
    instances: Mapping[str, int] | None = None,
    torch_threads: int | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Write the models of one pipeline version missing from ``destination``; returns their names.

    Composing models first, ensembles last, so an ensemble never names a model not yet there.
    ``manifest`` None renders the committed configs alone (no built artifacts, the template
    embedding width): what the static config checks use.
    """
    destination.mkdir(parents=True, exist_ok=True)
    dimension = None if manifest is None else int(manifest["embedding_dimension"])
    names = served_names(version, parts)
    written = [
        names[part]
        for part in COMPOSING_MODELS
        if render_part(
            destination,
            part,
            int(parts[part]),
            profile,
            source,
            dimension,
            instances,
            torch_threads,
            overrides,
        )
    ]
    written += write_pipeline_ensembles(destination, version, parts, manifest, profile, source)
    return written


def render_models(
    destination: Path,
    profile: str,
    source: Path = DEFAULT_REPOSITORY,
    instances: Mapping[str, int] | None = None,
    torch_threads: int | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    additive: bool = False,
) -> list[str]:
    """Render every pipeline version built in ``source`` into ``destination``; returns the model
    names written.

    ``additive`` False replaces ``destination`` (a fresh render). ``additive`` True only adds the
    models missing from it and never touches existing ones, so it is safe while Triton serves
    ``destination`` (each new model appears whole, by a rename). Raises FileNotFoundError when
    ``source`` has no built pipeline version.
    """
    if source.resolve().is_relative_to(destination.resolve()):
        raise ValueError(f"{destination} holds the source repository {source}: render elsewhere")
    versions = list_versions(source)
    if not versions:
        raise FileNotFoundError(
            f"no pipeline version is built in {source}: run python -m build_models"
        )
    if not additive and destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for version in versions:
        manifest = read_manifest(source, version)
        written += render_version(
            destination,
            version,
            part_versions(manifest),
            profile,
            manifest,
            source,
            instances,
            torch_threads,
            overrides,
        )
    return written


def render_repository(
    destination: Path,
    profile: str,
    source: Path = DEFAULT_REPOSITORY,
    instances: Mapping[str, int] | None = None,
    torch_threads: int | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    additive: bool = False,
) -> Path:
    """Write a servable repository for ``profile`` into ``destination``: every pipeline version
    of ``source`` under its own model names (``served_names``). Returns ``destination``.

    ``additive`` False: ``destination`` is replaced. True: only missing models are added (safe
    while Triton serves it). Artifacts of ``source`` are symlinked; model.py files are copied.
    """
    render_models(destination, profile, source, instances, torch_threads, overrides, additive)
    return destination


def main(argv: list[str] | None = None) -> int:
    """``python -m build_models.profiles``: render a profile into a directory."""
    p = argparse.ArgumentParser(prog="python -m build_models.profiles", description=__doc__)
    p.add_argument("--profile", choices=PROFILES, required=True)
    p.add_argument("--out", type=Path, required=True, help="directory to (re)create")
    p.add_argument(
        "--add",
        action="store_true",
        help="only add the models missing from --out, never touch existing ones (safe while "
        "Triton serves --out); default: replace --out",
    )
    p.add_argument("--source", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument(
        "--instances",
        action="append",
        default=[],
        metavar="MODEL=N",
        help="instance count per GPU/CPU for a model, e.g. bert=2 (repeatable)",
    )
    args = p.parse_args(argv)
    instances = {}
    for item in args.instances:
        model, _, count = item.partition("=")
        if model not in COMPOSING_MODELS or not count.isdigit() or int(count) < 1:
            p.error(f"--instances expects MODEL=N with MODEL in {COMPOSING_MODELS}, got {item!r}")
        instances[model] = int(count)
    try:
        written = render_models(args.out, args.profile, args.source, instances, additive=args.add)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: {', '.join(written) if written else 'nothing new'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
