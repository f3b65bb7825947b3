"""Offline tooling for the Helm chart checks (tests/test_helm.py): no cluster, no helm binary.

- Rendering and lint: ``helm-python-sdk`` (Helm 4's Go SDK as a library), the same template engine,
  values-schema validation and lint rules as the ``helm`` command.
- Kubernetes objects: ``kubernetes-validate``'s strict JSON schemas of each Kubernetes version
  (generated from the API's OpenAPI documents; strict = unknown fields are errors).
- Custom resources (PodMonitor, ScaledObject): the operators' own CRDs, copied into
  deploy/helm/crd-schemas/ (its README names the releases), their ``openAPIV3Schema`` made strict
  the same way. CEL rules (``x-kubernetes-validations``) are not evaluated: no API server here.
"""

from __future__ import annotations

import copy
import functools
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import referencing
import yaml

from tests.conftest import ROOT

CHART = ROOT / "deploy" / "helm" / "textscore"
CRD_SCHEMAS = ROOT / "deploy" / "helm" / "crd-schemas"
ADAPTER_VALUES = ROOT / "deploy" / "helm" / "prometheus-adapter-values.yaml"
KUBERNETES_DOC = ROOT / "docs" / "kubernetes.md"
# The oldest minor version the chart claims (Chart.yaml kubeVersion) and the newest that
# kubernetes-validate 1.37.0 ships schemas for.
KUBERNETES_VERSIONS = ("1.30", "1.37")
# The value sets `make test` renders: CPU only, one GPU, several GPUs with KEDA.
VALUE_SETS = {path.stem.removesuffix("-values"): path for path in sorted(CHART.glob("ci/*.yaml"))}
RELEASE = "textscore"
NAMESPACE = "ml"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def load_values(path: Path) -> dict[str, Any]:
    """A values file as a dict."""
    return dict(yaml.safe_load(path.read_text()) or {})


def render_templates(
    values: dict[str, Any], name: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    """Every template of the chart rendered with ``values`` (template path -> text).

    Raises helm_python.HelmRenderError when a template calls ``fail`` or ``required``, and
    HelmValuesError when the values break values.schema.json, as ``helm install`` would.
    """
    with helm_python.Chart.load(CHART) as chart:
        return chart.render(values, name=name, namespace=namespace, is_install=True)


def manifests(templates: dict[str, str]) -> list[dict[str, Any]]:
    """The Kubernetes objects of rendered templates (NOTES.txt and empty documents left out)."""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(templates.items()):
        if path.endswith(".yaml"):
            objects.extend(document for document in yaml.safe_load_all(text) if document)
    return objects


@functools.cache
def _rendered(value_set: str) -> tuple[dict[str, Any], ...]:
    return tuple(manifests(render_templates(load_values(VALUE_SETS[value_set]))))


def rendered(value_set: str) -> list[dict[str, Any]]:
    """The objects of one value set, rendered once per session; each call gets its own copy."""
    return copy.deepcopy(list(_rendered(value_set)))


def values_of(value_set: str) -> dict[str, Any]:
    """The chart's defaults with a value set merged in, as Helm merges them."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.merge_values(load_values(VALUE_SETS[value_set]))


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of ``kind``."""
    found = [item for item in objects if item["kind"] == kind]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> set[str]:
    """The kinds of ``objects``."""
    return {item["kind"] for item in objects}


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The Deployment's pod spec."""
    return dict(only(objects, "Deployment")["spec"]["template"]["spec"])


def container(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """A container of the pod by name."""
    found = [c for c in pod_spec(objects)["containers"] if c["name"] == name]
    assert len(found) == 1, f"no single container named {name}"
    return dict(found[0])


def env(container_spec: dict[str, Any]) -> dict[str, str]:
    """A container's plain ``name: value`` environment variables."""
    return {
        item["name"]: item["value"] for item in container_spec.get("env", []) if "value" in item
    }


def flags(arguments: list[str]) -> dict[str, list[str]]:
    """``--flag=value`` arguments grouped by flag (flags repeat)."""
    grouped: dict[str, list[str]] = {}
    for argument in arguments:
        if argument.startswith("--"):
            flag, _, value = argument.partition("=")
            grouped.setdefault(flag, []).append(value)
    return grouped


def option(command: list[str], name: str) -> str:
    """The value after ``name`` in an argv list (``--timeout 30``)."""
    return command[command.index(name) + 1]


_QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {
    None: 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def quantity_bytes(value: str | int) -> int:
    """A Kubernetes memory quantity (``352Mi``, ``1Gi``, ``1000``) in bytes."""
    found = _QUANTITY.match(str(value))
    assert found, f"not a quantity: {value!r}"
    return int(float(found.group(1)) * _FACTORS[found.group(2)])


# --- Kubernetes schemas ------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One validation error of one object."""

    kind: str
    name: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} at {self.path or '/'}: {self.message}"


def validate_builtin(item: dict[str, Any], version: str) -> list[Finding]:
    """Strict validation of a built-in kind with kubernetes-validate's schema of ``version``."""
    try:
        used = kubernetes_validate.validate(item, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = "/".join(str(part) for part in error.path)
        return [Finding(item["kind"], item["metadata"]["name"], path, error.message)]
    # The package falls back to an older schema when it lacks the version asked for: refuse that.
    assert used == version, f"validated against {used}, not {version}"
    return []


def is_builtin(item: dict[str, Any], version: str) -> bool:
    """Whether kubernetes-validate has a schema for the object's kind and apiVersion."""
    try:
        kubernetes_validate.validate(
            {"apiVersion": item["apiVersion"], "kind": item["kind"]}, version, strict=True
        )
    except kubernetes_validate.SchemaNotFoundError:
        return False
    except kubernetes_validate.ValidationError:
        return True
    return True


def _strict(schema: Any) -> Any:
    """An openAPIV3Schema as a strict JSON schema: objects with declared properties refuse
    unknown ones (unless the CRD preserves unknown fields there), ``nullable`` admits null."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in result
        and "additionalProperties" not in result
        and not result.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    if result.pop("nullable", False) and "type" in result:
        result["type"] = [result["type"], "null"]
    return result


@functools.cache
def _definitions(version: str) -> referencing.Resource[Any]:
    """kubernetes-validate's strict definitions of ``version`` (ObjectMeta for custom resources)."""
    contents = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{version}.0-local-strict/_definitions.json", version
    )
    return referencing.Resource.from_contents(contents)


@functools.cache
def crd_validator(api_version: str, kind: str, version: str) -> jsonschema.protocols.Validator:
    """A strict validator of a custom resource from the CRD kept in deploy/helm/crd-schemas/."""
    group, _, served = api_version.partition("/")
    for path in sorted(CRD_SCHEMAS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd["spec"]["group"] != group or crd["spec"]["names"]["kind"] != kind:
                continue
            for entry in crd["spec"]["versions"]:
                if entry["name"] == served:
                    schema = _strict(entry["schema"]["openAPIV3Schema"])
                    # CRD schemas leave metadata open; the API server checks it as ObjectMeta.
                    schema["properties"]["metadata"] = {
                        "$ref": f"https://kubernetes.io/api/_definitions.json#/$defs/{OBJECT_META}"
                    }
                    registry: referencing.Registry[Any] = referencing.Registry().with_resource(
                        "https://kubernetes.io/api/_definitions.json", _definitions(version)
                    )
                    return jsonschema.Draft202012Validator(schema, registry=registry)
    raise LookupError(f"no CRD for {kind} ({api_version}) in {CRD_SCHEMAS}")


def validate_custom(item: dict[str, Any], version: str) -> list[Finding]:
    """Strict validation of a custom resource against its CRD's schema."""
    validator = crd_validator(item["apiVersion"], item["kind"], version)
    return [
        Finding(
            item["kind"],
            item["metadata"]["name"],
            "/".join(str(part) for part in error.absolute_path),
            error.message,
        )
        for error in validator.iter_errors(item)
    ]


def validate(item: dict[str, Any], version: str) -> list[Finding]:
    """Strict validation of any rendered object: built-in kinds, else their CRD."""
    if is_builtin(item, version):
        return validate_builtin(item, version)
    return validate_custom(item, version)


def yaml_blocks(markdown: str) -> Iterator[Any]:
    """The parsed documents of every ```yaml block of a Markdown text (list items indent them)."""
    for _indent, block in re.findall(r"^( *)```yaml\n(.*?)^\1```", markdown, re.M | re.S):
        text = textwrap.dedent(block)
        yield from (document for document in yaml.safe_load_all(text) if document is not None)
