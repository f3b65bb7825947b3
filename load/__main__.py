"""``python -m load``."""

from load.cli import main

raise SystemExit(main())
