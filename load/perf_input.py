"""Write a ``perf_analyzer --input-data`` JSON file of texts from the realistic mix.

python -m load.perf_input --out /tmp/texts.json --count 2000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from load.workload import DEFAULT_SEED, TextMix, make_texts


def perf_analyzer_document(texts: list[str]) -> dict[str, object]:
    """One ``text`` BYTES tensor of shape [1] per entry; perf_analyzer stacks them into batches."""
    return {"data": [{"text": {"content": [text], "shape": [1]}} for text in texts]}


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m load.perf_input``."""
    parser = argparse.ArgumentParser(prog="python -m load.perf_input", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    texts = make_texts(args.count, TextMix(seed=args.seed))
    args.out.write_text(json.dumps(perf_analyzer_document(texts)))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
