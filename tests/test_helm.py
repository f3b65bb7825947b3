"""The Helm chart (deploy/helm/textscore), checked offline: no cluster and no helm binary here.

Real tooling (tests/helm_support.py): Helm 4's engine (helm-python-sdk) renders the chart for
every value set of ci/ and runs `helm lint --strict` for each Kubernetes version; every rendered
object is validated strictly against kubernetes-validate's schemas of Kubernetes 1.30 and 1.37,
and custom resources against the operators' CRDs kept in deploy/helm/crd-schemas/. Helm's lint
mode turns `fail` and `required` into log lines, so the chart's refusals are checked by
rendering. The rest are this project's own assertions on the rendered objects: the pod shape,
lifecycle, autoscaling and operations that `helm install` must give, as `docker compose up` does.
"""

from __future__ import annotations

import http.server
import json
import math
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from build_models.profiles import COMPOSING_MODELS, ENSEMBLES, PROFILES
from gateway.settings import Settings
from load.queue_signal import SAMPLE, queue_us_per_request
from tests.conftest import ROOT
from tests.deploy_files import (
    BUILDER_SCRIPT,
    DASHBOARD_FILE,
    DOCKERFILES,
    GATEWAY_PATHS,
    VERSIONS_FILE,
    command_flags,
    read_env_file,
    stack,
)
from tests.helm_support import (
    ADAPTER_VALUES,
    CHART,
    KUBERNETES_DOC,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    container,
    env,
    flags,
    is_builtin,
    kinds,
    load_values,
    manifests,
    only,
    option,
    pod_spec,
    quantity_bytes,
    render_templates,
    rendered,
    validate,
    values_of,
    yaml_blocks,
)
from tests.test_dashboard import TRITON_METRICS, promql_metric_names, sample_names

DRAIN_SCRIPT = CHART / "files" / "drain.py"
SETS = sorted(VALUE_SETS)
EXAMPLE_DIGEST = "0" * 64


def base_values(**overrides: Any) -> dict[str, Any]:
    """Minimal values that render (a key digest is the one thing the chart requires)."""
    values: dict[str, Any] = {"apiKeys": {"digests": [f"{EXAMPLE_DIGEST}:infer"]}}
    values.update(overrides)
    return values


def triton_ports(value_set: str) -> set[int]:
    return {int(port) for port in values_of(value_set)["triton"]["ports"].values()}


# --- the value sets, lint and schemas ----------------------------------------------------------


def test_the_three_value_sets_exist() -> None:
    assert SETS == ["cpu", "gpu", "multi-gpu-keda"]
    assert [values_of(name)["gpu"]["count"] for name in SETS] == [0, 1, 4]
    assert values_of("multi-gpu-keda")["autoscaling"]["engine"] == "keda"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("value_set", SETS)
def test_helm_lint_strict_passes(value_set: str, version: str) -> None:
    report = helm_python.lint(
        CHART, load_values(VALUE_SETS[value_set]), strict=True, kube_version=f"v{version}.0"
    )
    # Severity 1 is info ("icon is recommended"); --strict fails on warnings (2) and errors (3).
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_helm_lint_strict_passes_with_the_defaults(version: str) -> None:
    # What a first `helm lint --strict deploy/helm/textscore` sees: lint mode only logs the
    # chart's refusal to run without API keys, so the defaults must lint clean.
    report = helm_python.lint(CHART, strict=True, kube_version=f"v{version}.0")
    assert not [m for m in report["messages"] if m["severity"] >= 2] and not report["errors"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("value_set", SETS)
def test_every_rendered_object_validates_strictly(value_set: str, version: str) -> None:
    objects = rendered(value_set)
    assert objects
    findings = [finding for item in objects for finding in validate(item, version)]
    assert not findings, "\n".join(str(finding) for finding in findings)


def test_custom_resources_are_validated_against_their_crds() -> None:
    custom = {
        (item["apiVersion"], item["kind"])
        for name in SETS
        for item in rendered(name)
        if not is_builtin(item, KUBERNETES_VERSIONS[-1])
    }
    # Both custom kinds the chart can render; nothing else lacks a Kubernetes schema.
    assert custom == {
        ("monitoring.coreos.com/v1", "PodMonitor"),
        ("keda.sh/v1alpha1", "ScaledObject"),
    }


@pytest.mark.parametrize("kind", ["Deployment", "PodMonitor", "ScaledObject", "Service"])
def test_strict_validation_rejects_a_misspelt_field(kind: str) -> None:
    # Guards the validation above: an unknown field deep in the spec must be an error.
    item = only(rendered("multi-gpu-keda"), kind)
    item["spec"]["replicaz"] = 3
    item["metadata"]["labelz"] = {"a": "b"}
    findings = validate(item, KUBERNETES_VERSIONS[0])
    assert findings, f"a misspelt field in a {kind} passed"


def test_chart_kube_version_admits_both_validated_versions() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    found = re.fullmatch(r">=(\d+)\.(\d+)\.0-0", chart["kubeVersion"])
    assert found, chart["kubeVersion"]
    oldest = (int(found.group(1)), int(found.group(2)))
    assert oldest == tuple(int(part) for part in KUBERNETES_VERSIONS[0].split("."))
    for version in KUBERNETES_VERSIONS:
        assert tuple(int(part) for part in version.split(".")) >= oldest


def test_values_schema_refuses_unknown_keys_and_bad_values() -> None:
    good = load_values(VALUE_SETS["gpu"])
    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(good)
        bad_values: list[dict[str, Any]] = [
            {**good, "replicas": 3},
            {**good, "gateway": {"transport": "carrier_pigeon"}},
            {**good, "apiKeys": {"digests": ["not-a-digest:infer"]}},
            {**good, "gateway": {"env": {"TRANSPORT": "grpc"}}},
            {**good, "modelRepository": {"source": "ftp"}},
            {**good, "autoscaling": {"engine": "cron"}},
        ]
        for bad in bad_values:
            with pytest.raises(helm_python.HelmValuesError):
                chart.validate_schema(bad)


REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "no API keys": ({"apiKeys": {"digests": []}}, "apiKeys"),
    "drain shorter than a request": (
        {"lifecycle": {"drainTimeoutSeconds": 5}, "gateway": {"requestTimeoutSeconds": 10}},
        "drainTimeoutSeconds",
    ),
    "gateway port on a Triton port": ({"gateway": {"port": 8001}}, "gateway.port"),
    "cuda_shm without a shared GPU": ({"gateway": {"transport": "cuda_shm"}}, "cuda_shm"),
    "grace period shorter than the drain": (
        {"lifecycle": {"terminationGracePeriodSeconds": 20}},
        "terminationGracePeriodSeconds",
    ),
    "budget that blocks every drain": (
        {"podDisruptionBudget": {"minAvailable": 2}, "replicaCount": 2},
        "minAvailable",
    ),
    "autoscaling without Triton's metrics": (
        {"autoscaling": {"enabled": True}, "triton": {"exposeMetrics": False}},
        "exposeMetrics",
    ),
    "volume source without a volume": ({"modelRepository": {"source": "volume"}}, "volume.source"),
    "object store without a URL": ({"modelRepository": {"source": "objectStore"}}, "url"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_chart_refuses_values_that_cannot_work(case: str) -> None:
    overrides, message = REFUSALS[case]
    values = base_values()
    values.update(overrides)
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render_templates(values)


def test_minimal_values_render_and_validate() -> None:
    objects = manifests(render_templates(base_values()))
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"} <= kinds(objects)
    for version in KUBERNETES_VERSIONS:
        assert not [f for item in objects for f in validate(item, version)]


# --- pod shape -----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_gateway_and_triton_share_an_in_memory_dev_shm_sized_for_both(value_set: str) -> None:
    objects, values = rendered(value_set), values_of(value_set)
    spec = pod_spec(objects)
    assert [c["name"] for c in spec["containers"]] == ["gateway", "triton"]
    shm = next(volume for volume in spec["volumes"] if volume["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    for name in ("gateway", "triton"):
        mounts = {m["mountPath"]: m["name"] for m in container(objects, name)["volumeMounts"]}
        assert mounts["/dev/shm"] == "shm", f"{name} does not mount the shared /dev/shm"
    # The Python backend (preprocess, on every GPU) plus every slot of the gateway's pool.
    devices = max(1, values["gpu"]["count"])
    python_backend = values["modelRepository"]["instances"]["preprocess"] * devices * 64 * 2**20
    gateway_env = env(container(objects, "gateway"))
    pool = int(gateway_env["GATEWAY_SHM_POOL_SIZE"]) * int(gateway_env["GATEWAY_SHM_REGION_BYTES"])
    assert quantity_bytes(shm["emptyDir"]["sizeLimit"]) >= python_backend + pool
    # The gateway's regions go through it: the pool's settings are the chart's.
    assert gateway_env["GATEWAY_TRANSPORT"] == values["gateway"]["transport"] == "system_shm"


@pytest.mark.parametrize("value_set", SETS)
def test_gpu_limits_exactly_where_the_values_ask_for_gpus(value_set: str) -> None:
    objects, values = rendered(value_set), values_of(value_set)
    count, resource = values["gpu"]["count"], values["gpu"]["resource"]
    triton = container(objects, "triton")["resources"]
    gateway = container(objects, "gateway")["resources"]
    if count:
        assert triton["limits"][resource] == count
        assert triton["requests"][resource] == count
        assert flags(container(objects, "triton")["args"])["--allow-gpu-metrics"] == ["true"]
    else:
        assert resource not in triton.get("limits", {}) and resource not in triton.get(
            "requests", {}
        )
    assert resource not in gateway.get("limits", {}), "the gateway has no GPU unless cuda_shm"
    for init in pod_spec(objects).get("initContainers", []):
        assert resource not in init["resources"].get("limits", {})


def test_gateway_gets_a_gpu_only_for_cuda_shm() -> None:
    values = base_values(gateway={"transport": "cuda_shm", "gpu": {"enabled": True}})
    objects = manifests(render_templates(values))
    assert container(objects, "gateway")["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env(container(objects, "gateway"))["GATEWAY_CUDA_DEVICE_ID"] == "0"


@pytest.mark.parametrize("value_set", SETS)
def test_every_container_is_non_root_read_only_and_has_requests_and_limits(value_set: str) -> None:
    spec = pod_spec(rendered(value_set))
    pod_security = spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    # The images' own user (USER 1000:1000): shared-memory regions are mode 0600.
    for dockerfile in DOCKERFILES.values():
        assert re.search(r"^USER 1000:1000$", dockerfile.read_text(), re.M), dockerfile
    assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (1000, 1000)
    assert pod_security["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    for item in [*spec.get("initContainers", []), *spec["containers"]]:
        security = item["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, item["name"]
        assert security["allowPrivilegeEscalation"] is False, item["name"]
        assert security["capabilities"]["drop"] == ["ALL"], item["name"]
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(item["resources"][bound]), f"{item['name']} {bound}"
        # A read-only root needs a writable /tmp.
        assert "/tmp" in {mount["mountPath"] for mount in item["volumeMounts"]}, item["name"]


@pytest.mark.parametrize("value_set", SETS)
def test_triton_inference_ports_stay_inside_the_pod(value_set: str) -> None:
    objects, values = rendered(value_set), values_of(value_set)
    triton = container(objects, "triton")
    parsed = flags(triton["args"])
    assert parsed["--http-address"] == parsed["--grpc-address"] == ["127.0.0.1"]
    # The one Triton port declared is the metrics port, for Prometheus.
    declared = [port["containerPort"] for port in triton.get("ports", [])]
    assert declared == [values["triton"]["ports"]["metrics"]]
    assert parsed["--metrics-port"] == [str(values["triton"]["ports"]["metrics"])]
    gateway_env = env(container(objects, "gateway"))
    assert gateway_env["GATEWAY_TRITON_GRPC_URL"] == f"127.0.0.1:{parsed['--grpc-port'][0]}"
    assert int(gateway_env["GATEWAY_PORT"]) not in triton_ports(value_set)


def test_triton_metrics_can_stay_on_loopback_too() -> None:
    objects = manifests(render_templates(base_values(triton={"exposeMetrics": False})))
    triton = container(objects, "triton")
    assert flags(triton["args"])["--metrics-address"] == ["127.0.0.1"]
    assert "ports" not in triton
    assert len(only(objects, "NetworkPolicy")["spec"]["ingress"]) == 1


@pytest.mark.parametrize("value_set", SETS)
def test_triton_runs_the_compose_stacks_server_flags(value_set: str) -> None:
    objects = rendered(value_set)
    args = container(objects, "triton")["args"]
    # args (not command) keep the NGC image's entrypoint; the shell clears a crashed server's
    # regions (the prefix Triton is given below) before it execs tritonserver, as compose does.
    assert args[:2] == ["sh", "-c"] and args[3] == "tritonserver", args[:4]
    removed = re.search(r"rm -f /dev/shm/(\S+)\*", args[2])
    assert removed and 'exec tritonserver "$@"' in args[2]
    chart_flags = flags(args[4:])
    assert chart_flags["--backend-config"] == [f"python,shm-region-prefix-name={removed.group(1)}"]
    compose_flags = command_flags(stack()["services"]["triton"]["command"][1:])
    # Where the pod differs on purpose: the repository's location, loopback addresses and ports
    # shared with the gateway's namespace, the exit timeout, GPU metrics only with a GPU.
    pod_only = {
        "--model-repository",
        "--http-address",
        "--http-port",
        "--grpc-address",
        "--grpc-port",
        "--metrics-address",
        "--exit-timeout-secs",
        "--allow-gpu-metrics",
    }
    for flag, value in compose_flags.items():
        if flag not in pod_only:
            assert chart_flags.get(flag) == value, flag
    assert set(chart_flags) - set(compose_flags) <= pod_only
    assert sorted(chart_flags["--load-model"]) == sorted(f"{name}_v1" for name in ENSEMBLES)


@pytest.mark.parametrize("value_set", SETS)
def test_model_repository_comes_from_the_source_the_values_choose(value_set: str) -> None:
    objects, values = rendered(value_set), values_of(value_set)
    spec = pod_spec(objects)
    source = values["modelRepository"]["source"]
    repository = flags(container(objects, "triton")["args"])["--model-repository"][0]
    triton_mounts = {m["name"]: m for m in container(objects, "triton")["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    if source == "builder":
        (builder,) = spec["initContainers"]
        builder_env = env(builder)
        assert builder_env["TRITON_PROFILE"] in PROFILES
        # A GPU profile needs a GPU; without one, the same backends on KIND_CPU.
        expected = "gpu" if values["gpu"]["count"] else "gpu-image-cpu"
        assert builder_env["TRITON_PROFILE"] == expected
        for item in builder_env["TRITON_INSTANCES"].split():
            model, _, count = item.partition("=")
            assert model in COMPOSING_MODELS and int(count) >= 1, item
        served = re.search(r"^served_repository=(\S+)", BUILDER_SCRIPT.read_text(), re.M)
        assert served and repository == served.group(1)
        assert {m["mountPath"] for m in builder["volumeMounts"] if m["name"] == "models"} == {
            "/models"
        }
        assert "emptyDir" in volumes["models"]
        assert triton_mounts["models"]["readOnly"] is True
    elif source == "volume":
        assert "initContainers" not in spec
        assert volumes["models"]["persistentVolumeClaim"]["readOnly"] is True
        assert repository == f"/models/{values['modelRepository']['volume']['path']}"
        assert triton_mounts["models"]["readOnly"] is True
    else:
        assert re.match(r"^(s3|gs|as)://", repository)
        assert "models" not in volumes and "initContainers" not in spec
        secret = values["modelRepository"]["objectStore"]["envFromSecret"]
        assert container(objects, "triton")["envFrom"] == [{"secretRef": {"name": secret}}]


def test_builder_image_carries_the_committed_configs_where_build_sh_reads_them() -> None:
    # Compose mounts the checkout over this path; in a pod the image's own copy is all there is.
    committed = re.search(r"^committed=(\S+)", BUILDER_SCRIPT.read_text(), re.M)
    assert committed
    dockerfile = DOCKERFILES["builder"].read_text()
    assert re.search(rf"^COPY model_repository {re.escape(committed.group(1))}$", dockerfile, re.M)
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    # Ensembles need their (empty) version folders: build.sh copies the .gitkeep files.
    assert "!model_repository/*/[0-9]*/.gitkeep" in ignored


@pytest.mark.parametrize("value_set", SETS)
def test_images_are_the_compose_stacks_at_the_release_of_versions_env(value_set: str) -> None:
    spec = pod_spec(rendered(value_set))
    release = read_env_file(VERSIONS_FILE)["TRITON_RELEASE"]
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert version and chart["appVersion"] == version.group(1)
    images = {c["name"]: c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]}
    assert images["gateway"].endswith(f"textscore-gateway:{version.group(1)}")
    assert images["triton"].endswith(f"textscore-triton:{release}")
    if "builder" in images:
        assert images["builder"].endswith(f"textscore-builder:{release}")
    registry = values_of(value_set)["images"]["registry"]
    for image in images.values():
        assert image.startswith(f"{registry}/" if registry else "textscore-"), image


@pytest.mark.parametrize("value_set", SETS)
def test_every_gateway_variable_is_a_setting_and_validates(
    value_set: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    objects = rendered(value_set)
    gateway_env = env(container(objects, "gateway"))
    fields = set(Settings.model_fields)
    for name in gateway_env:
        assert name.startswith("GATEWAY_"), name
        assert name.removeprefix("GATEWAY_").lower() in fields, f"{name} is no gateway setting"
    for name, value in gateway_env.items():
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)
    assert settings.workers == 1, "one worker per container: every scrape sees the whole process"
    assert {settings.regression_model, settings.embedding_model} == set(ENSEMBLES)
    assert settings.host == "0.0.0.0"
    # The keys file is the Secret's key, mounted where GATEWAY_API_KEYS_FILE points.
    mounts = {m["name"]: m["mountPath"] for m in container(objects, "gateway")["volumeMounts"]}
    assert str(settings.api_keys_file).startswith(mounts["api-keys"] + "/")
    secrets = [item for item in objects if item["kind"] == "Secret"]
    if secrets:
        keys_file = tmp_path / "api-keys"
        keys_file.write_text(next(iter(secrets[0]["stringData"].values())))
        entries = Settings(_env_file=None, api_keys_file=keys_file).key_entries
        assert entries == values_of(value_set)["apiKeys"]["digests"]


def test_extra_gateway_settings_pass_through() -> None:
    values = base_values(gateway={"env": {"GATEWAY_MAX_TEXTS_PER_REQUEST": 64}})
    gateway_env = env(container(manifests(render_templates(values)), "gateway"))
    assert gateway_env["GATEWAY_MAX_TEXTS_PER_REQUEST"] == "64"


# --- lifecycle -----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_probes_startup_long_enough_readiness_on_readyz_liveness_on_livez(value_set: str) -> None:
    objects = rendered(value_set)
    gateway = container(objects, "gateway")
    for probe, path in (
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/livez"),
    ):
        assert gateway[probe]["httpGet"] == {"path": path, "port": "http"}, probe
        assert path in GATEWAY_PATHS
    # /readyz includes Triton's model loading and every warm-up: at least the compose stack's
    # start period (180 s on a GPU, 300 s under the CPU override), here 600 s and more.
    budget = gateway["startupProbe"]["periodSeconds"] * gateway["startupProbe"]["failureThreshold"]
    assert budget >= (300 if values_of(value_set)["gpu"]["count"] == 0 else 180) * 2
    triton = container(objects, "triton")
    http_port = flags(triton["args"])["--http-port"][0]
    assert f"127.0.0.1:{http_port}/v2/health/ready" in triton["startupProbe"]["exec"]["command"][-1]
    assert f"127.0.0.1:{http_port}/v2/health/live" in triton["livenessProbe"]["exec"]["command"][-1]
    triton_budget = (
        triton["startupProbe"]["periodSeconds"] * triton["startupProbe"]["failureThreshold"]
    )
    assert triton_budget <= budget, "the gateway must not give up before Triton may"


@pytest.mark.parametrize("value_set", SETS)
def test_prestop_drains_and_the_grace_period_outlasts_every_step(value_set: str) -> None:
    objects = rendered(value_set)
    spec = pod_spec(objects)
    gateway, triton = container(objects, "gateway"), container(objects, "triton")
    drain = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert drain[1].endswith("/drain.py") and drain[2] == "gateway"
    wait_before, drain_timeout = (
        float(option(drain, "--wait-before")),
        float(option(drain, "--timeout")),
    )
    assert wait_before > 0, "the endpoints' removal needs time to reach every proxy"
    request_timeout = float(env(gateway)["GATEWAY_REQUEST_TIMEOUT_S"])
    assert drain_timeout >= request_timeout, "a request that just started must be able to finish"
    assert (
        option(drain, "--metrics-url") == f"http://127.0.0.1:{env(gateway)['GATEWAY_PORT']}/metrics"
    )
    # Triton waits for the gateway to be gone (its preStop, then its shutdown).
    wait = triton["lifecycle"]["preStop"]["exec"]["command"]
    assert wait[1] == drain[1] and wait[2] == "triton"
    assert option(wait, "--port") == env(gateway)["GATEWAY_PORT"]
    triton_wait = float(option(wait, "--timeout"))
    assert triton_wait > wait_before + drain_timeout
    exit_timeout = float(flags(triton["args"])["--exit-timeout-secs"][0])
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > wait_before + drain_timeout
    assert grace > triton_wait + exit_timeout
    # The hook script is the chart's file, mounted where the commands run it.
    mounts = {m["name"]: m["mountPath"] for m in gateway["volumeMounts"]}
    assert drain[1] == f"{mounts['lifecycle']}/drain.py"
    lifecycle = next(
        item for item in objects if item["kind"] == "ConfigMap" and "drain.py" in item["data"]
    )
    assert lifecycle["data"]["drain.py"] == DRAIN_SCRIPT.read_text()
    assert drain[0] == "python" and wait[0] == "python3", "each image's own interpreter"


@pytest.mark.parametrize("value_set", SETS)
def test_disruption_budget_and_rolling_updates_never_drop_below_it(value_set: str) -> None:
    objects, values = rendered(value_set), values_of(value_set)
    deployment = only(objects, "Deployment")
    budget = only(objects, "PodDisruptionBudget")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    # A new pod is ready before an old one goes: the ready count never falls during an update.
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    assert strategy["rollingUpdate"]["maxSurge"] >= 1
    autoscaled = values["autoscaling"]["enabled"]
    floor = values["autoscaling"]["minReplicas"] if autoscaled else deployment["spec"]["replicas"]
    assert floor >= 2, "one pod cannot be disrupted without an outage"
    if "minAvailable" in budget["spec"]:
        assert budget["spec"]["minAvailable"] < floor, "node drains must stay possible"
    else:
        assert 1 <= budget["spec"]["maxUnavailable"] < floor
    # With an autoscaler, the Deployment leaves the replica count to it (upgrades keep the count).
    assert ("replicas" in deployment["spec"]) != autoscaled


# --- autoscaling ---------------------------------------------------------------------------


def adapter_rule() -> dict[str, Any]:
    (rule,) = load_values(ADAPTER_VALUES)["rules"]["custom"]
    return dict(rule)


def model_matchers(expression: str) -> dict[str, set[str]]:
    """Metric name -> the template models its ``model=~"(a|b)_v[0-9]+"`` matcher selects (every
    pipeline version of each)."""
    matchers: dict[str, set[str]] = {}
    # Label values are quoted and may hold braces themselves (a pod regex's "{5}").
    for name, labels in re.findall(r'(\w+)\{((?:[^}"]|"(?:[^"\\]|\\.)*")*)\}', expression):
        found = re.search(r'\bmodel=~"\(([^")]+)\)_v\[0-9\]\+"', labels)
        if found:
            matchers[name] = set(found.group(1).split("|"))
    return matchers


def test_the_adapter_rule_serves_the_hpa_metric_from_tritons_series() -> None:
    rule, values = adapter_rule(), values_of("gpu")
    assert rule["name"]["as"] == values["autoscaling"]["hpa"]["metricName"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    query = (
        rule["metricsQuery"].replace("<<.GroupBy>>", "pod").replace("<<.LabelMatchers>>", 'a="b"')
    )
    known = sample_names(TRITON_METRICS)
    assert promql_metric_names(query) <= known
    assert promql_metric_names(rule["seriesQuery"]) <= known
    assert model_matchers(query) == {
        "nv_inference_queue_duration_us": set(COMPOSING_MODELS),
        "nv_inference_request_success": set(ENSEMBLES),
    }
    assert re.findall(r"\[(\w+)\]", query) == [values["autoscaling"]["rateWindow"]] * 2


def test_hpa_scales_the_deployment_on_queue_time_with_both_behaviours() -> None:
    objects, values = rendered("gpu"), values_of("gpu")
    hpa = only(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": only(objects, "Deployment")["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == adapter_rule()["name"]["as"]
    target = values["autoscaling"]["targetQueueMicroseconds"]
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": str(target)}
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0, "scale up at once"
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300, "scale down slowly"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert "ScaledObject" not in kinds(objects)


def test_keda_scales_on_the_same_signal_for_this_release_only() -> None:
    objects, values = rendered("multi-gpu-keda"), values_of("multi-gpu-keda")
    assert "HorizontalPodAutoscaler" not in kinds(objects), "KEDA creates its own HPA"
    scaled = only(objects, "ScaledObject")
    assert (
        scaled["spec"]["scaleTargetRef"]["name"] == only(objects, "Deployment")["metadata"]["name"]
    )
    assert scaled["spec"]["minReplicaCount"] >= 1, "never to zero: warm-up takes minutes"
    assert (
        scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        == values["autoscaling"]["behavior"]
    )
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    metadata = trigger["metadata"]
    assert metadata["threshold"] == str(values["autoscaling"]["targetQueueMicroseconds"])
    query = metadata["query"]
    assert promql_metric_names(query) <= sample_names(TRITON_METRICS)
    assert model_matchers(query) == {
        "nv_inference_queue_duration_us": set(COMPOSING_MODELS),
        "nv_inference_request_success": set(ENSEMBLES),
    }
    # Selects this release's pods in its namespace, and no other release's.
    pods = set(re.findall(r'pod=~"([^"]+)"', query))
    assert len(pods) == 1 and f'namespace="{NAMESPACE}"' in query
    pattern = re.compile(pods.pop())
    assert pattern.fullmatch(f"{RELEASE}-5d8f7c9b4-x2x7q")
    assert not pattern.fullmatch(f"{RELEASE}-canary-5d8f7c9b4-x2x7q")
    assert "clamp_min" in query, "an idle release reads 0, not NaN"


def test_the_measurement_behind_the_target_computes_the_charts_signal() -> None:
    # load.queue_signal measured the figures the 20 ms target was chosen from (docs/benchmarks.md):
    # its formula must be the one the chart scales on.
    exposition = "\n".join(
        [
            'nv_inference_queue_duration_us{model="preprocess_v1",version="1"} 1000',
            'nv_inference_queue_duration_us{model="bert_v1",version="1"} 5000',
            'nv_inference_queue_duration_us{model="text_regression_v1",version="1"} 99999',
            'nv_inference_request_success{model="text_regression_v1",version="1"} 10',
            'nv_inference_request_success{model="bert_v1",version="1"} 10',
        ]
    )
    before = {(name, model): 0.0 for name, model, _ in SAMPLE.findall(exposition)}
    after = {(name, model): float(value) for name, model, value in SAMPLE.findall(exposition)}
    # Steps' queue time (the ensemble's own counter left out) per ensemble request.
    assert queue_us_per_request(before, after) == (1000 + 5000) / 10
    assert queue_us_per_request(after, after) == 0.0, "idle reads 0, as clamp_min makes it"


# --- operations ----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_no_service_exposes_a_triton_port(value_set: str) -> None:
    objects = rendered(value_set)
    gateway_ports = {
        port["name"]: port["containerPort"] for port in container(objects, "gateway")["ports"]
    }
    triton_names = {port["name"] for port in container(objects, "triton").get("ports", [])}
    services = [item for item in objects if item["kind"] == "Service"]
    assert len(services) == 1
    for port in services[0]["spec"]["ports"]:
        target = port["targetPort"]
        assert target in gateway_ports, f"Service port {port} is not the gateway's"
        assert target not in triton_names
        assert gateway_ports[target] not in triton_ports(value_set)
        assert port["port"] not in triton_ports(value_set) or port["port"] == gateway_ports[target]


@pytest.mark.parametrize("value_set", SETS)
def test_network_policy_admits_the_gateway_port_and_metrics_from_prometheus_only(
    value_set: str,
) -> None:
    objects = rendered(value_set)
    policy = only(objects, "NetworkPolicy")
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted: dict[str, Any] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            admitted[port["port"]] = rule.get("from")
    assert set(admitted) == {"http", "triton-metrics"}
    assert admitted["triton-metrics"], "Triton's metrics port is for Prometheus alone"
    gateway_port = {p["name"]: p for p in container(objects, "gateway")["ports"]}
    triton_port = {p["name"]: p for p in container(objects, "triton")["ports"]}
    assert "http" in gateway_port and "triton-metrics" in triton_port


@pytest.mark.parametrize("value_set", [name for name in SETS if name != "cpu"])
def test_pod_monitor_scrapes_the_gateway_and_triton_metrics(value_set: str) -> None:
    objects = rendered(value_set)
    monitor = only(objects, "PodMonitor")
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    endpoints = {e["port"]: e["path"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert endpoints == {"http": "/metrics", "triton-metrics": "/metrics"}
    assert "/metrics" in GATEWAY_PATHS


def test_dashboard_config_map_is_the_compose_stacks_dashboard() -> None:
    objects = rendered("gpu")
    (dashboard,) = [
        item for item in objects if item["kind"] == "ConfigMap" and "textscore.json" in item["data"]
    ]
    assert json.loads(dashboard["data"]["textscore.json"]) == json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    # The chart reads the file through a link, so the two can never drift apart.
    assert (CHART / "files" / "textscore-dashboard.json").resolve() == DASHBOARD_FILE.resolve()


@pytest.mark.parametrize("value_set", SETS)
def test_api_key_digests_come_from_a_secret(value_set: str) -> None:
    objects, values = rendered(value_set), values_of(value_set)
    volume = next(v for v in pod_spec(objects)["volumes"] if v["name"] == "api-keys")
    name = volume["secret"]["secretName"]
    secrets = [item for item in objects if item["kind"] == "Secret"]
    if values["apiKeys"]["existingSecret"]:
        assert not secrets and name == values["apiKeys"]["existingSecret"]
        return
    (secret,) = secrets
    assert secret["metadata"]["name"] == name
    for line in secret["stringData"][values["apiKeys"]["existingSecretKey"]].split():
        assert re.fullmatch(r"[0-9a-f]{64}(:[a-z+]+)?", line), "digests only, never keys"
    assert "GATEWAY_API_KEYS" not in env(container(objects, "gateway")), "not in the pod spec"


def test_ingress_example_terminates_tls_for_the_gateway_service() -> None:
    objects = rendered("gpu")
    ingress = only(objects, "Ingress")
    hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
    assert hosts and {host for tls in ingress["spec"]["tls"] for host in tls["hosts"]} == hosts
    assert all(tls["secretName"] for tls in ingress["spec"]["tls"])
    service = only(objects, "Service")
    for rule in ingress["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}


# --- the preStop hooks, run for real --------------------------------------------------------


class MetricsServer:
    """A stand-in for the gateway's /metrics: in-flight counts in turn, or a fixed status."""

    def __init__(self, counts: list[float], status: int = 200) -> None:
        self.counts, self.status, self.requests = counts, status, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                count = outer.counts[min(outer.requests, len(outer.counts) - 1)]
                outer.requests += 1
                body = (
                    f"# TYPE gateway_requests_in_flight gauge\ngateway_requests_in_flight {count}\n"
                )
                self.send_response(outer.status)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: Any) -> None:
                """Silence the per-request log line."""

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> MetricsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def run_hook(*arguments: str) -> tuple[str, float]:
    """Run drain.py as the kubelet would; its last output line and how long it took."""
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(DRAIN_SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip(), time.monotonic() - started


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_gateway_hook_waits_then_returns_once_nothing_is_in_flight() -> None:
    with MetricsServer([2, 1, 0]) as server:
        output, took = run_hook(
            "gateway",
            "--wait-before",
            "0.3",
            "--timeout",
            "10",
            "--metrics-url",
            server.url,
            "--poll",
            "0.05",
        )
    assert output.startswith("drain.py gateway: drained")
    assert server.requests == 3
    assert 0.3 <= took < 5


def test_gateway_hook_gives_up_at_its_timeout_and_when_metrics_are_closed() -> None:
    with MetricsServer([3]) as server:
        output, took = run_hook(
            "gateway",
            "--wait-before",
            "0",
            "--timeout",
            "0.4",
            "--metrics-url",
            server.url,
            "--poll",
            "0.05",
        )
    assert output.startswith("drain.py gateway: timeout") and took >= 0.4
    # A protected /metrics (401): nothing to read, so the whole timeout is waited.
    with MetricsServer([0], status=401) as server:
        output, took = run_hook(
            "gateway",
            "--wait-before",
            "0",
            "--timeout",
            "0.4",
            "--metrics-url",
            server.url,
            "--poll",
            "0.05",
        )
    assert output.startswith("drain.py gateway: unknown") and took >= 0.4


def test_gateway_hook_returns_at_once_when_the_gateway_is_gone() -> None:
    url = f"http://127.0.0.1:{closed_port()}/metrics"
    output, took = run_hook(
        "gateway", "--wait-before", "0", "--timeout", "10", "--metrics-url", url
    )
    assert output.startswith("drain.py gateway: gone") and took < 5


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A loopback socket that accepts connections (the gateway's port while it runs)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def test_triton_hook_waits_while_the_gateway_listens(listening: socket.socket) -> None:
    port = str(listening.getsockname()[1])
    output, took = run_hook("triton", "--port", port, "--timeout", "0.4", "--poll", "0.05")
    assert output.startswith("drain.py triton: timeout") and took >= 0.4
    threading.Timer(0.3, listening.close).start()
    output, took = run_hook("triton", "--port", port, "--timeout", "10", "--poll", "0.05")
    assert output.startswith("drain.py triton: closed") and 0.3 <= took < 5


# --- the guide -----------------------------------------------------------------------------


def test_every_yaml_example_of_the_guide_is_valid() -> None:
    documents = list(yaml_blocks(KUBERNETES_DOC.read_text()))
    objects = [d for d in documents if isinstance(d, dict) and "apiVersion" in d]
    values = [d for d in documents if isinstance(d, dict) and "apiVersion" not in d]
    assert len(objects) >= 2 and len(values) >= 4, "the Job example and the values snippets"
    for item in objects:
        for version in KUBERNETES_VERSIONS:
            findings = validate(item, version)
            assert not findings, "\n".join(map(str, findings))
    with helm_python.Chart.load(CHART) as chart:
        for snippet in values:
            chart.validate_schema(snippet)
            render_templates({**base_values(), **snippet})


def test_capacity_table_follows_from_the_measured_per_replica_figures() -> None:
    doc, benchmarks = KUBERNETES_DOC.read_text(), (ROOT / "docs" / "benchmarks.md").read_text()
    rows = re.findall(
        r"^\| ([\d,]+) req/s \| p99 <= (\d+) ms \| ([\d.]+) req/s \| (\d+) \|$", doc, re.M
    )
    assert len(rows) >= 6, "the capacity table"
    for rate, _p99, per_replica, replicas in rows:
        needed = math.ceil(int(rate.replace(",", "")) / float(per_replica))
        assert int(replicas) == max(2, needed), (rate, per_replica, replicas)
        # Each per-replica figure is a measured one of docs/benchmarks.md.
        assert f"| {per_replica} |" in benchmarks, per_replica
