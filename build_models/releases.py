"""The one table of Triton releases and the artifact formats their backends read.

The builder, the compose stack (deploy/versions.env, checked against this table by the tests)
and the checks all read from here.
"""

from __future__ import annotations

from dataclasses import dataclass


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
