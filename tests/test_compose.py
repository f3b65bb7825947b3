"""Static checks of the docker compose stack: no Docker engine runs here, so what Compose, Triton
and the gateway would refuse at start is checked against the project's own code instead."""

from __future__ import annotations

import importlib.resources
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import pytest

from build_models.profiles import COMPOSING_MODELS, ENSEMBLES, PROFILES
from build_models.releases import DEFAULT_RELEASE, release
from gateway.settings import Settings
from tests.conftest import ROOT
from tests.deploy_files import (
    BUILDER_SCRIPT,
    COMPOSE_FILE,
    CPU_OVERRIDE_FILE,
    GATEWAY_ENV_EXAMPLE,
    GATEWAY_PATHS,
    PROMETHEUS_FILE,
    VERSIONS_FILE,
    command_flags,
    interpolations,
    load_yaml,
    read_env_file,
    stack,
    without_merge_tags,
)

COMPOSE_FILES = (COMPOSE_FILE, CPU_OVERRIDE_FILE)


def compose_schema() -> dict[str, Any]:
    """The compose specification's JSON schema, as the check-jsonschema package vendors it."""
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    return dict(json.loads((vendored / "compose-spec.json").read_text()))


def healthcheck_url(service: dict[str, Any]) -> str:
    """The URL a ``CMD python -c "...urlopen('URL'...)"`` healthcheck requests."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", "exec form: no shell needed in the image"
    found = re.search(r"urlopen\('([^']+)'", " ".join(test[1:]))
    assert found, f"healthcheck does not request a URL: {test}"
    return found.group(1)


def versions() -> dict[str, str]:
    return read_env_file(VERSIONS_FILE)


# --- the files are valid Compose -------------------------------------------------------------


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda path: path.name)
def test_compose_file_matches_the_compose_specification(path: Path) -> None:
    document = without_merge_tags(load_yaml(path))
    validator_class = jsonschema.validators.validator_for(compose_schema())
    errors = sorted(validator_class(compose_schema()).iter_errors(document), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "gpu+cpu-override"])
def test_merged_stack_matches_the_compose_specification(cpu: bool) -> None:
    validator_class = jsonschema.validators.validator_for(compose_schema())
    errors = list(validator_class(compose_schema()).iter_errors(stack(cpu=cpu)))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_schema_check_rejects_a_broken_service() -> None:
    # Guards the check above: a misspelt key must not pass.
    broken = {"services": {"triton": {"image": "x:1", "depends_on": {"b": {"condition": "ok"}}}}}
    validator_class = jsonschema.validators.validator_for(compose_schema())
    assert list(validator_class(compose_schema()).iter_errors(broken))


# --- one place for the versions ----------------------------------------------------------------


def test_versions_env_agrees_with_the_release_table() -> None:
    values = versions()
    target = release(values["TRITON_RELEASE"])
    assert values["TRITON_RELEASE"] == DEFAULT_RELEASE
    assert values["TRITON_SERVER_VERSION"] == target.server_version
    assert values["TREELITE_VERSION"] == target.treelite
    assert values["PYTORCH_VERSION"] == target.pytorch
    assert values["PYTHON_VERSION"] == target.python
    # The NGC PyTorch container of the same month ships the libtorch of Triton's PyTorch backend.
    assert values["PYTORCH_RELEASE"] == target.ngc_tag
    # Client and server of one release share the version number.
    assert values["TRITONCLIENT_VERSION"] == target.server_version


def test_versions_env_agrees_with_the_pins_of_pyproject() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    values = versions()
    assert f'"treelite=={values["TREELITE_VERSION"]}"' in pyproject
    pinned_client = re.search(r'"tritonclient\[[^\]]*\]==([0-9.]+)"', pyproject)
    assert pinned_client and pinned_client.group(1) == values["TRITONCLIENT_VERSION"]


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda path: path.name)
def test_every_compose_variable_has_a_default_and_versions_match(path: Path) -> None:
    values = versions()
    for variable in interpolations(path):
        # A plain `docker compose up` sets no variables: each needs a default.
        assert variable.default is not None, f"${{{variable.name}}} in {path.name} has no default"
        if variable.name in values:
            assert variable.default == values[variable.name], (
                f"{path.name}: the default of ${{{variable.name}}} is {variable.default}, "
                f"deploy/versions.env says {values[variable.name]}"
            )


def test_every_tool_version_of_versions_env_reaches_compose() -> None:
    used = {variable.name for variable in interpolations(COMPOSE_FILE)}
    # Checked against releases.py above; no image needs them as build arguments.
    descriptive = {"TRITON_SERVER_VERSION", "PYTORCH_VERSION", "PYTHON_VERSION"}
    assert set(versions()) - descriptive <= used


def test_compose_build_args_are_the_dockerfiles_args() -> None:
    services = stack()["services"]
    for name in ("builder", "triton"):
        build = services[name]["build"]
        dockerfile = ROOT / build["context"] / build.get("dockerfile", "Dockerfile")
        declared = set(re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)", dockerfile.read_text(), re.M))
        assert set(build["args"]) == declared, f"{name}: compose args vs ARGs of {dockerfile}"


# --- the services --------------------------------------------------------------------------


def test_builder_renders_a_known_profile_and_runs_before_triton() -> None:
    services = stack()["services"]
    builder, triton = services["builder"], services["triton"]
    assert builder["environment"]["TRITON_PROFILE"] == "gpu"
    assert triton["depends_on"]["builder"]["condition"] == "service_completed_successfully"
    assert builder.get("restart") == "no"
    for item in builder["environment"]["TRITON_INSTANCES"].split():
        model, _, count = item.partition("=")
        assert model in COMPOSING_MODELS and count.isdigit() and int(count) >= 1, item
    # The builder writes into the volume that triton serves, at the path triton reads.
    script = BUILDER_SCRIPT.read_text()
    served = re.search(r"^served_repository=(\S+)", script, re.M)
    assert served, "build.sh names the served repository"
    flags = command_flags(triton["command"])
    assert flags["--model-repository"] == [served.group(1)]
    builder_volume = next(v for v in builder["volumes"] if v.startswith("models:"))
    triton_volume = next(v for v in triton["volumes"] if v.startswith("models:"))
    assert builder_volume.split(":")[1] == triton_volume.split(":")[1] == "/models"
    assert triton_volume.endswith(":ro")
    # Re-runnable while Triton serves: new versions are added, served models never replaced.
    render = re.search(r"^python -m build_models\.profiles .*$", script.replace("\\\n", ""), re.M)
    assert render and "--add" in render.group(0).split(), "build.sh renders additively"


def test_triton_loads_exactly_the_repository_ensembles_explicitly() -> None:
    triton = stack()["services"]["triton"]
    flags = command_flags(triton["command"])
    assert flags["--model-control-mode"] == ["explicit"]
    # Pipeline version 1's ensembles, under their served names, of the committed templates.
    assert sorted(flags["--load-model"]) == sorted(f"{name}_v1" for name in ENSEMBLES)
    for model in flags["--load-model"]:
        template = model.removesuffix("_v1")
        assert (ROOT / "model_repository" / template / "config.pbtxt").is_file()


def test_triton_has_a_gpu_and_a_readiness_healthcheck() -> None:
    triton = stack()["services"]["triton"]
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert urlparse(healthcheck_url(triton)).path == "/v2/health/ready"
    # Its HTTP port is the one the healthcheck asks (Triton's default, 8000).
    assert urlparse(healthcheck_url(triton)).port == 8000


def test_triton_ports_are_not_published_beyond_localhost() -> None:
    for cpu in (False, True):
        for mapping in stack(cpu=cpu)["services"]["triton"].get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), mapping


def test_gateway_reaches_triton_over_the_compose_network() -> None:
    services = stack()["services"]
    gateway, triton = services["gateway"], services["triton"]
    environment = gateway["environment"]
    host, _, port = environment["GATEWAY_TRITON_GRPC_URL"].partition(":")
    assert host == "triton" and port in triton["expose"]
    assert port == "8001", "Triton's default gRPC port"
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert gateway["command"] == ["python", "-m", "gateway", "serve"]
    # Shared-memory regions are created mode 0600: only the same uid can open them in Triton.
    assert gateway["user"] == triton["user"]


# --- /dev/shm: one tmpfs volume in both containers ---------------------------------------------

SHM_MOUNT = {"type": "volume", "source": "shm", "target": "/dev/shm", "volume": {"nocopy": True}}
# Triton's Python backend wants at least this much shared memory per model instance.
PYTHON_BACKEND_SHM_PER_INSTANCE = 64 * 1024 * 1024


def tmpfs_size_bytes(size: str) -> int:
    """A tmpfs ``size=`` value (``512m``, ``1g``, bytes) in bytes."""
    found = re.fullmatch(r"(\d+)([kmg]?)", size.lower())
    assert found, f"not a tmpfs size: {size}"
    return int(found.group(1)) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[found.group(2)]


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "gpu+cpu-override"])
def test_triton_and_gateway_share_dev_shm_through_a_volume_not_an_ipc_namespace(cpu: bool) -> None:
    # POSIX shared memory (the gateway's system_shm regions, the Python backend's tensors) needs
    # the same tmpfs at /dev/shm, nothing of an IPC namespace. A namespace joined across
    # containers (`ipc: service:triton`) keeps the old /dev/shm when Triton's container restarts.
    services = stack(cpu=cpu)["services"]
    for name in ("triton", "gateway"):
        service = services[name]
        assert "ipc" not in service, f"{name} must not join or share an IPC namespace"
        assert "shm_size" not in service, f"{name}: /dev/shm is the shm volume, sized there"
        assert SHM_MOUNT in service["volumes"], f"{name} mounts the shm volume at /dev/shm"


def test_the_shm_volume_is_a_tmpfs_big_enough_for_triton_and_the_gateway() -> None:
    model = stack()
    volume = model["volumes"]["shm"]
    assert volume["driver"] == "local"
    options = volume["driver_opts"]
    assert options["type"] == options["device"] == "tmpfs"
    mount_options = dict(
        item.partition("=")[::2] for item in options["o"].split(",") if "=" in item
    )
    # Writable by every uid (sticky, as Docker's own /dev/shm): regions are created by uid 1000.
    assert mount_options["mode"] == "1777"
    instances = model["services"]["builder"]["environment"]["TRITON_INSTANCES"].split()
    # Every composing model counted as a Python-backend one: an upper bound for any profile.
    python_backend = sum(int(item.partition("=")[2]) for item in instances)
    settings = Settings(_env_file=None)
    gateway_pool = settings.shm_pool_size * settings.shm_region_bytes
    needed = python_backend * PYTHON_BACKEND_SHM_PER_INSTANCE + gateway_pool
    assert tmpfs_size_bytes(mount_options["size"]) >= 2 * needed, "room for both, with slack"


def test_triton_removes_the_regions_a_crashed_predecessor_left_in_the_shared_volume() -> None:
    command = stack()["services"]["triton"]["command"]
    # sh -c SCRIPT $0 ARGS...: the script runs, then execs tritonserver with every flag.
    assert command[:2] == ["sh", "-c"]
    script, zero = command[2], command[3]
    assert zero == "tritonserver"
    assert script.endswith('&& exec tritonserver "$@"')
    removed = re.fullmatch(r'rm -f /dev/shm/(\S+)\* && exec tritonserver "\$@"', script)
    assert removed, script
    backend_configs = command_flags(command)["--backend-config"]
    assert f"python,shm-region-prefix-name={removed.group(1)}" in backend_configs
    # Only the Python backend's regions: the gateway's carry its own prefix.
    assert not removed.group(1).startswith(Settings(_env_file=None).shm_prefix)


def test_gateway_publishes_8000_and_checks_readyz() -> None:
    gateway = stack()["services"]["gateway"]
    assert gateway["ports"] == ["127.0.0.1:8000:8000"]
    assert gateway["environment"]["GATEWAY_PORT"] == "8000"
    url = urlparse(healthcheck_url(gateway))
    assert url.path == "/readyz" and url.port == 8000
    assert url.path in GATEWAY_PATHS


def test_every_gateway_variable_is_a_setting_and_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = stack()["services"]["gateway"]
    assert gateway["env_file"] == "deploy/gateway.env"
    example = read_env_file(GATEWAY_ENV_EXAMPLE)
    fields = set(Settings.model_fields)
    for name in [*gateway["environment"], *example]:
        assert name.startswith("GATEWAY_"), name
        assert name.removeprefix("GATEWAY_").lower() in fields, f"{name} is no gateway setting"
    for name, value in gateway["environment"].items():
        monkeypatch.setenv(name, str(value))
    settings = Settings(_env_file=None)
    assert settings.triton_grpc_url == "triton:8001"
    assert settings.host == "0.0.0.0"
    assert {settings.regression_model, settings.embedding_model} == set(ENSEMBLES)


def test_gateway_env_example_is_committed_and_the_real_file_is_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "deploy/gateway.env" in ignored
    assert "deploy/gateway.env" in (ROOT / ".dockerignore").read_text().splitlines()
    # The placeholder must not be a usable digest: a copied example must not start a gateway.
    keys = read_env_file(GATEWAY_ENV_EXAMPLE)["GATEWAY_API_KEYS"]
    assert not re.fullmatch(r"[0-9a-f]{64}(:[a-z+]+)?", keys)


def test_cpu_override_drops_the_gpu_and_keeps_the_real_backends() -> None:
    services = stack(cpu=True)["services"]
    assert "deploy" not in services["triton"]
    profile = services["builder"]["environment"]["TRITON_PROFILE"]
    assert profile == "gpu-image-cpu" and profile in PROFILES
    # Everything else of the production shape stays.
    for name in ("triton", "gateway"):
        assert services[name]["volumes"] == stack()["services"][name]["volumes"]
    assert services["triton"]["command"] == stack()["services"]["triton"]["command"]


def test_prometheus_scrapes_the_gateway_and_triton_metrics_ports() -> None:
    config = load_yaml(PROMETHEUS_FILE)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    triton_flags = command_flags(stack()["services"]["triton"]["command"])
    gateway_port = stack()["services"]["gateway"]["environment"]["GATEWAY_PORT"]
    assert jobs["gateway"]["static_configs"][0]["targets"] == [f"gateway:{gateway_port}"]
    assert jobs["gateway"].get("metrics_path", "/metrics") in GATEWAY_PATHS
    assert jobs["triton"]["static_configs"][0]["targets"] == [
        f"triton:{triton_flags['--metrics-port'][0]}"
    ]


def test_grafana_mounts_its_provisioning_and_dashboards() -> None:
    grafana = stack()["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    providers = load_yaml(ROOT / "deploy/grafana/provisioning/dashboards/textscore.yml")
    assert mounts["./deploy/grafana/dashboards"] == providers["providers"][0]["options"]["path"]
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]


def test_images_pulled_by_compose_have_exact_tags() -> None:
    for name, service in stack(cpu=True)["services"].items():
        if "image" in service and "build" not in service:
            image = service["image"]
            assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+(@sha256:[0-9a-f]{64})?", image), (
                f"{name}: {image} is not pinned to an exact release"
            )
