"""Lint of the stack's Dockerfiles and builder script, plus the image rules that matter most."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.deploy_files import (
    BUILDER_SCRIPT,
    DOCKERFILES,
    VERSIONS_FILE,
    read_env_file,
    stack,
)

BUILD_TOOLS = re.compile(
    r"\b(build-essential|gcc|g\+\+|clang|make|cmake|python3?-dev|libc6-dev|cargo|rustc)\b"
)


def tool(name: str) -> str:
    """A linter installed by the dev extras (next to this interpreter), else from PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is missing: `make install` installs it (pyproject.toml, dev extras)"
    return found


@dataclass
class Stage:
    """One FROM ... stage of a Dockerfile: its base image and instructions."""

    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def stages(dockerfile: Path) -> list[Stage]:
    """The stages of a Dockerfile (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            result.append(Stage(base=rest.split()[0]))
        elif result:
            result[-1].instructions.append((keyword, rest.strip()))
    return result


def resolved(image: str) -> str:
    """An image reference with ${VAR} replaced by deploy/versions.env's value."""
    values = read_env_file(VERSIONS_FILE)
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], image)


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_passes(name: str) -> None:
    run = subprocess.run(
        [tool("hadolint"), "--no-color", str(DOCKERFILES[name])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


SHELL_SCRIPTS = [
    BUILDER_SCRIPT,
    ROOT / ".ci" / "run",
    *sorted((ROOT / "load").glob("*.sh")),
    *sorted((ROOT / "tests" / "gpu").glob("*.sh")),
    *sorted((ROOT / "tests" / "browser").glob("*.sh")),
]


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda path: path.name)
def test_shellcheck_passes_on_every_shell_script(script: Path) -> None:
    run = subprocess.run(
        [tool("shellcheck"), "-x", str(script)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_base_images_are_pinned_to_an_exact_release(name: str) -> None:
    for stage in stages(DOCKERFILES[name]):
        image = resolved(stage.base)
        repository, _, tag = image.partition("@")[0].rpartition(":")
        assert repository and tag, f"{name}: {stage.base} has no tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: {image} is not exact"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_stage_runs_as_an_unprivileged_user(name: str) -> None:
    users = [
        rest for keyword, rest in stages(DOCKERFILES[name])[-1].instructions if keyword == "USER"
    ]
    assert users, f"{name}: the final stage sets no USER, so it runs as root"
    assert users[-1].split(":")[0] not in ("root", "0"), f"{name}: USER {users[-1]}"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_stage_installs_no_build_tools(name: str) -> None:
    for keyword, rest in stages(DOCKERFILES[name])[-1].instructions:
        if keyword == "RUN":
            assert not BUILD_TOOLS.search(rest), f"{name}: build tools in the final stage: {rest}"


def test_gateway_image_is_multi_stage_on_an_exact_slim_python_311() -> None:
    gateway_stages = stages(DOCKERFILES["gateway"])
    assert len(gateway_stages) >= 2
    for stage in gateway_stages:
        assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", stage.base)
    final = gateway_stages[-1]
    # Dependencies are installed in the build stage only; the final stage copies the venv.
    assert not any(k == "RUN" and "pip install" in rest for k, rest in final.instructions)
    assert any(k == "COPY" and rest.startswith("--from=") for k, rest in final.instructions)
    assert final.instructions[-1] == ("CMD", '["python", "-m", "gateway", "serve"]')


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_long_running_images_have_a_healthcheck(name: str) -> None:
    service = stack()["services"][name]
    if service.get("restart") == "no":
        pytest.skip(f"{name} is a one-shot job")
    in_dockerfile = any(k == "HEALTHCHECK" for k, _ in stages(DOCKERFILES[name])[-1].instructions)
    assert in_dockerfile or "healthcheck" in service
