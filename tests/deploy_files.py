"""Readers for the compose stack's files, shared by the static deployment checks.

Compose itself cannot run here (no Docker engine), so these helpers do the few parts of its
work that the checks need: YAML with Compose's merge tags, ``${VAR:-default}`` interpolation
and the override merge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"
CPU_OVERRIDE_FILE = ROOT / "docker-compose.cpu.yml"
VERSIONS_FILE = ROOT / "deploy" / "versions.env"
GATEWAY_ENV_EXAMPLE = ROOT / "deploy" / "gateway.env.example"
DASHBOARD_FILE = ROOT / "deploy" / "grafana" / "dashboards" / "textscore.json"
PROMETHEUS_FILE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA_PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
BUILDER_SCRIPT = ROOT / "deploy" / "builder" / "build.sh"
DOCKERFILES = {
    "builder": ROOT / "deploy" / "builder" / "Dockerfile",
    "triton": ROOT / "deploy" / "triton" / "Dockerfile",
    "gateway": ROOT / "deploy" / "gateway" / "Dockerfile",
}

# The paths the gateway serves (its contract with the lead's gateway.app): healthchecks,
# Prometheus and docs/deployment.md use them.
GATEWAY_PATHS = ("/livez", "/readyz", "/metrics", "/v1/predict", "/v1/embed", "/v1/models")

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}; and $$, Compose's
# escape for a literal $ (a match without a name).
INTERPOLATION = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
)


class Reset:
    """Compose's ``!reset`` tag: remove the key from the merged result."""


# PyYAML has no type hints (types-PyYAML is not a dependency): its classes are Any to mypy.
class _ComposeLoader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader plus the two merge tags Compose adds (``!reset``, ``!override``)."""


def _construct_reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    return Reset()


_ComposeLoader.add_constructor("!reset", _construct_reset)


@dataclass(frozen=True)
class Interpolation:
    """One ``${...}`` of a compose file."""

    name: str
    operator: str | None
    argument: str | None

    @property
    def default(self) -> str | None:
        """The value used when the variable is unset (None: no default)."""
        return self.argument if self.operator in (":-", "-") else None


def load_yaml(path: Path) -> Any:
    """Parse a YAML file, understanding Compose's merge tags."""
    return yaml.load(path.read_text(), Loader=_ComposeLoader)


def interpolations(path: Path) -> list[Interpolation]:
    """Every ``${...}`` in a file, in order."""
    return [
        Interpolation(match["name"], match["op"], match["arg"])
        for match in INTERPOLATION.finditer(path.read_text())
        if match["name"] is not None
    ]


def interpolate(value: Any, variables: dict[str, str]) -> Any:
    """Resolve ``${...}`` in every string of ``value`` as Compose does with ``variables`` set."""
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, operator, argument = match["name"], match["op"], match["arg"]
            if name is None:
                return "$"
            current = variables.get(name)
            if operator in (":-", ":?") and not current:
                current = None
            if current is not None:
                return current
            if operator in (":-", "-"):
                return str(argument)
            raise KeyError(f"${{{name}}} is unset and has no default")

        return INTERPOLATION.sub(substitute, value)
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    return value


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of an env file (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, separator, value = line.partition("=")
        if not separator or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{path}:{number}: not a KEY=value line: {line!r}")
        values[key] = value
    return values


def merge(base: Any, override: Any) -> Any:
    """Merge an override file into a base as Compose does for mappings and scalars.

    Mappings merge key by key, ``!reset`` removes a key, anything else replaces. (Compose merges a
    few sequences, such as ports, differently; the CPU override sets none of them.)
    """
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if isinstance(value, Reset):
                merged.pop(key, None)
            elif key in merged:
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = value
        return merged
    return override


def without_merge_tags(value: Any) -> Any:
    """``value`` without the keys tagged ``!reset`` (they are directives, not configuration)."""
    if isinstance(value, dict):
        return {k: without_merge_tags(v) for k, v in value.items() if not isinstance(v, Reset)}
    if isinstance(value, list):
        return [without_merge_tags(item) for item in value]
    return value


def stack(*, cpu: bool = False) -> dict[str, Any]:
    """The compose model as Compose would see it with no variables set (their defaults)."""
    model = load_yaml(COMPOSE_FILE)
    if cpu:
        model = merge(model, load_yaml(CPU_OVERRIDE_FILE))
    return dict(interpolate(model, {}))


def command_flags(command: list[str]) -> dict[str, list[str]]:
    """``--flag=value`` arguments of a command line, grouped by flag (flags repeat)."""
    flags: dict[str, list[str]] = {}
    for argument in command:
        if argument.startswith("--"):
            flag, _, value = argument.partition("=")
            flags.setdefault(flag, []).append(value)
    return flags
