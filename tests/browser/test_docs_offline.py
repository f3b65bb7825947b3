"""Swagger UI and ReDoc render in a real headless browser with no network (check_docs_offline.sh).

Runs only where Debian's ``chromium`` is installed (``apt-get install chromium``); no Triton needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "check_docs_offline.sh"


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs Chromium: apt-get install chromium"
)
def test_docs_render_in_headless_chromium_with_no_network(tmp_path: Path) -> None:
    run = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().splitlines()[-1].startswith("ok:"), run.stdout
    for page in ("docs", "redoc"):
        screenshot = tmp_path / f"{page}.png"
        # A blank page compresses to a few kB; a rendered one is over 100 kB.
        assert screenshot.stat().st_size > 30_000, f"{screenshot} looks blank"
