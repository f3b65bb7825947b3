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

Artifacts are linked, not copied. Rendering also applies the embedding width of the build and
per-model instance counts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from build_models.pipeline import DEFAULT_REPOSITORY

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


def render_repository(
    destination: Path,
    profile: str,
    source: Path = DEFAULT_REPOSITORY,
    instances: Mapping[str, int] | None = None,
    torch_threads: int | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
) -> Path:
    """Write a servable repository for ``profile`` into ``destination`` (replaced if present).

    Artifacts of ``source`` are symlinked; model.py files are copied. Returns ``destination``.
    """
    manifest_path = source / "build-manifest.json"
    dimension = (
        json.loads(manifest_path.read_text())["embedding_dimension"]
        if manifest_path.is_file()
        else None
    )
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    for name in MODELS:
        model_dir = source / name
        config = render_config(
            read_config(model_dir / "config.pbtxt"),
            profile,
            dimension,
            instances,
            torch_threads,
            overrides,
        )
        target = destination / name
        target.mkdir()
        write_config(config, target / "config.pbtxt")
        for version_dir in sorted(
            p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()
        ):
            out_version = target / version_dir.name
            out_version.mkdir()
            for item in version_dir.iterdir():
                if item.name == ".gitkeep":
                    continue
                if item.suffix == ".py":
                    shutil.copy2(item, out_version / item.name)
                else:
                    (out_version / item.name).symlink_to(item.resolve())
            if profile in STAND_IN_PROFILES and name in ("bert", "forest"):
                shutil.copy2(CPU_STAND_INS / f"{name}.py", out_version / "model.py")
    return destination


def main(argv: list[str] | None = None) -> int:
    """``python -m build_models.profiles``: render a profile into a directory."""
    p = argparse.ArgumentParser(prog="python -m build_models.profiles", description=__doc__)
    p.add_argument("--profile", choices=PROFILES, required=True)
    p.add_argument("--out", type=Path, required=True, help="directory to (re)create")
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
    render_repository(args.out, args.profile, args.source, instances)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
