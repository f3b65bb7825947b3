"""The one table of Triton releases and the artifact formats their backends read.

The builder, the compose stack (deploy/versions.env, checked against this table by the tests)
and the checks all read from here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TritonRelease:
    """What one NGC Triton release can load."""

    ngc_tag: str
    server_version: str
    treelite: str
    pytorch: str
    python: str


RELEASES: dict[str, TritonRelease] = {
    "24.10": TritonRelease(
        ngc_tag="24.10", server_version="2.51.0", treelite="4.3.0", pytorch="2.5.0", python="3.10"
    ),
    "24.09": TritonRelease(
        ngc_tag="24.09", server_version="2.50.0", treelite="4.3.0", pytorch="2.5.0", python="3.10"
    ),
}

# The release deployed by docker compose and emulated by the embedded server (pytriton 0.7.0 ships 2.51.0).
DEFAULT_RELEASE = "24.10"


class ReleaseMismatchError(RuntimeError):
    """The installed tooling would write an artifact the target Triton release cannot read."""


def release(tag: str) -> TritonRelease:
    """Look up a release by NGC tag, with a clear error for an unknown one."""
    try:
        return RELEASES[tag]
    except KeyError:
        known = ", ".join(sorted(RELEASES))
        raise ReleaseMismatchError(
            f"unknown Triton release {tag!r}; known releases: {known}"
        ) from None


def check_treelite(tag: str, installed: str) -> TritonRelease:
    """Refuse to write a Treelite checkpoint that release ``tag``'s FIL backend cannot deserialize."""
    target = release(tag)
    if installed != target.treelite:
        raise ReleaseMismatchError(
            f"treelite {installed} is installed, but Triton {tag}'s FIL backend reads checkpoints "
            f"of treelite {target.treelite} only ('Cannot deserialize model from a different version "
            f"of Treelite'); install treelite=={target.treelite} or pick another --triton-release"
        )
    return target


def check_pytorch(tag: str, installed: str) -> TritonRelease:
    """Refuse to export TorchScript with a PyTorch other than release ``tag``'s libtorch.

    Only major.minor is compared: NGC containers carry pre-release builds such as
    ``2.5.0a0+e000cf0ad9`` of the release that the PyTorch backend is built against.
    """
    target = release(tag)
    wanted = target.pytorch.split(".")[:2]
    if installed.split("+")[0].split(".")[:2] != wanted:
        raise ReleaseMismatchError(
            f"torch {installed} is installed, but Triton {tag}'s PyTorch backend runs libtorch "
            f"{target.pytorch}; export TorchScript with PyTorch {'.'.join(wanted)} (e.g. in "
            f"nvcr.io/nvidia/pytorch:{target.ngc_tag}-py3)"
        )
    return target


def check_manifest(path: Path) -> TritonRelease:
    """Refuse artifacts whose manifest says they were built by a PyTorch or a Treelite that the
    manifest's Triton release cannot load (e.g. a CPU development build).

    ``path`` is a pipeline version's ``manifest.json``, or a model repository: then its highest
    pipeline version's manifest is checked.
    """
    if path.is_dir():
        from build_models.versions import latest_version, manifest_path

        latest = latest_version(path)
        path = manifest_path(path, latest if latest is not None else 1)
    if not path.is_file():
        raise ReleaseMismatchError(
            f"{path} is missing: build the models first (python -m build_models, or the compose "
            "stack's builder), so that their versions can be checked"
        )
    manifest = json.loads(path.read_text())
    tag = str(manifest.get("triton_release", DEFAULT_RELEASE))
    versions = manifest.get("versions", {})
    try:
        check_treelite(tag, str(versions["treelite"]))
        return check_pytorch(tag, str(versions["torch"]))
    except KeyError as exc:
        raise ReleaseMismatchError(f"{path} records no {exc.args[0]} version") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m build_models.releases --check-installed TAG | --check-manifest PATH``.

    ``--check-installed``: the compose builder runs it before building, so a wrong base image
    fails in seconds with a clear message instead of producing artifacts that Triton refuses to
    load. ``--check-manifest``: the GPU benchmark runs it before serving built artifacts.
    """
    import argparse
    import importlib.metadata
    import sys

    parser = argparse.ArgumentParser(prog="python -m build_models.releases", description=__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check-installed", metavar="TAG", choices=sorted(RELEASES))
    what.add_argument(
        "--check-manifest",
        metavar="PATH",
        type=Path,
        help="a pipelines/<N>/manifest.json, or a model repository (its highest version)",
    )
    args = parser.parse_args(argv)
    try:
        if args.check_manifest is not None:
            target = check_manifest(args.check_manifest)
            print(
                f"{args.check_manifest}: built with treelite {target.treelite} and PyTorch "
                f"{target.pytorch.rsplit('.', 1)[0]}.x, which Triton {target.ngc_tag} loads"
            )
            return 0
        check_treelite(args.check_installed, importlib.metadata.version("treelite"))
        target = check_pytorch(args.check_installed, importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError as exc:
        print(f"error: {exc.name} is not installed", file=sys.stderr)
        return 2
    except ReleaseMismatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"treelite {target.treelite} and PyTorch {target.pytorch} match Triton {target.ngc_tag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
