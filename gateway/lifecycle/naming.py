"""How a pipeline version's models are named in Triton: ``<model>_v<N>``.

A ``config.pbtxt`` belongs to a model, not to a version, so an ensemble's steps cannot differ per
version. Each pipeline version is therefore its own set of Triton models (rendered by
``build_models.profiles``): ensembles ``text_regression_vN`` and ``text_embedding_vN`` whose steps
name the composing models of that version (shared with earlier versions when unchanged).
"""

from __future__ import annotations

import re

_VERSIONED = re.compile(r"^(?P<model>.+)_v(?P<version>[1-9][0-9]{0,8})$")


def versioned_name(model: str, version: int) -> str:
    """The Triton name of ``model`` in pipeline version ``version``."""
    return f"{model}_v{version}"


def parse_versioned(name: str) -> tuple[str, int] | None:
    """``(model, version)`` of a versioned Triton name, or None for any other name."""
    match = _VERSIONED.match(name)
    if match is None:
        return None
    return match["model"], int(match["version"])
