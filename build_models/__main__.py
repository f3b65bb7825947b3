"""``python -m build_models``: build the model repository's artifacts."""

from build_models.cli import main

raise SystemExit(main())
