"""Model lifecycle against a real embedded Triton: a rollout (load, warm, canary, promote, unload)
without a failed request, the canary's stickiness, the automatic rollback of a bad version, the
policy across a gateway restart, and the admin scope.

The module has its own source repository (the session's build, hard-linked, plus a version 2 that
retrains the forest alone) and its own Triton: versions come and go here, which the session's
shared server must not see.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from build_models.profiles import render_repository
from devtools.faulty_version import add_faulty_version
from devtools.triton import EmbeddedTriton
from gateway.auth import new_key
from tests.conftest import FAST_BUILD_ARGS, TEXTS, model_statistics, wait_for
from tests.gateway_support import RunningGateway, running_gateway

FAULTY = 9
# Pipeline version -> the file that turns its fault on (devtools.faulty_version).
served_faults: dict[int, Path] = {}


@pytest.fixture(scope="module")
def two_versions(built_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's build (version 1, hard-linked) and a version 2 with another forest."""
    source = tmp_path_factory.mktemp("lifecycle") / "source"
    shutil.copytree(built_repository, source, copy_function=os.link)
    args = list(FAST_BUILD_ARGS)
    args[args.index("--trees") + 1] = "5"  # only the forest differs: preprocess and bert are shared
    subprocess.run(
        [sys.executable, "-m", "build_models", "--repository", str(source), *args], check=True
    )
    return source


@pytest.fixture(scope="module")
def lifecycle_triton(
    two_versions: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedTriton]:
    """A Triton of this module's own, version 1 loaded, 2 and a faulty 9 in its repository."""
    served = render_repository(
        tmp_path_factory.mktemp("served") / "repository", "cpu", two_versions
    )
    switch = add_faulty_version(served, two_versions, base=1, version=FAULTY, fault="error")
    served_faults[FAULTY] = switch
    server = EmbeddedTriton(served, tmp_path_factory.mktemp("lifecycle-triton"))
    server.start()
    yield server
    server.stop()


def admin_post(gateway: RunningGateway, path: str, **body: Any) -> Any:
    with gateway.client(key="admin", timeout=None) as client:
        response = client.post(path, json=body or None)
    assert response.status_code == 200, response.text
    return response.json()


def predict(gateway: RunningGateway, key: str = "infer", **body: Any) -> dict[str, Any]:
    with gateway.client(key=key) as client:
        response = client.post("/v1/predict", json={"texts": TEXTS, **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def states(triton: EmbeddedTriton) -> dict[str, str]:
    """Triton's own view: model name -> state."""
    request = urllib.request.Request(f"http://{triton.http_url}/v2/repository/index", method="POST")
    with urllib.request.urlopen(request) as answer:
        return {entry["name"]: entry.get("state", "") for entry in json.load(answer)}


class Traffic:
    """Requests one after another in a thread until stopped; every answer kept."""

    def __init__(self, gateway: RunningGateway) -> None:
        self.gateway = gateway
        self.answers: list[tuple[int, str]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.gateway.client() as client:
            while not self._stop.is_set():
                response = client.post("/v1/predict", json={"texts": TEXTS[:2]})
                version = (
                    response.json().get("model_version", "") if response.status_code == 200 else ""
                )
                self.answers.append((response.status_code, version))

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_a_rollout_under_traffic_loses_no_request(
    lifecycle_triton: EmbeddedTriton, tmp_path: Path
) -> None:
    policy_path = tmp_path / "state" / "policy.json"
    with running_gateway(lifecycle_triton.grpc_url, policy_path=policy_path) as gateway:
        before = predict(gateway)
        assert before["model_version"] == "1"
        with Traffic(gateway) as traffic:
            loaded = admin_post(gateway, "/v1/admin/versions/2/load")
            assert loaded["state"] == "ready"
            assert loaded["manifest"]["parts"]["bert"]["version"] == 1  # the encoder is shared
            admin_post(gateway, "/v1/admin/policy/canary", version=2, percent=100)
            wait_for(lambda: any(v == "2" for _, v in traffic.answers), what="a v2 answer")
            admin_post(gateway, "/v1/admin/policy/promote")
            with gateway.client(key="admin", timeout=None) as client:
                unloaded = client.delete("/v1/admin/versions/1")
            assert unloaded.status_code == 200, unloaded.text
            count = len(traffic.answers)
            wait_for(lambda: len(traffic.answers) > count + 3, what="traffic after the unload")
        assert traffic.answers and not traffic.failures, traffic.failures[:3]
        assert {"1", "2"} <= {version for _, version in traffic.answers}
        after = predict(gateway)
        assert after["model_version"] == "2"
        assert after["scores"] != before["scores"]  # another forest
        served = states(lifecycle_triton)
        # v1's ensembles and its own forest are gone; the encoder it shares with v2 stays.
        assert served["text_regression_v1"] != "READY" and served["forest_v1"] != "READY"
        assert served["bert_v1"] == "READY" and served["text_regression_v2"] == "READY"
        # Loading v2 reused the serving encoder: Triton loaded bert_v1 once and never reloaded
        # v1's ensembles (it reloads a model whose files changed since its load, dependents too).
        log = lifecycle_triton.log_path.read_text()
        assert log.count('"loading: bert_v1:1"') == 1, log[-3000:]
        assert log.count('"loading: text_regression_v1:1"') == 1, log[-3000:]

    # A new gateway (a restart) adopts the stored policy: v2 serves, v1 is not reloaded.
    with running_gateway(lifecycle_triton.grpc_url, policy_path=policy_path) as restarted:
        assert predict(restarted)["model_version"] == "2"
        with restarted.client(key="admin") as client:
            policy = client.get("/v1/admin/policy").json()
        assert (policy["policy"]["stable"], policy["policy"]["previous_stable"]) == (2, 1)
        assert states(lifecycle_triton)["text_regression_v1"] != "READY"
        # Back to v1 for the next tests: load it, roll back, check who answers.
        admin_post(restarted, "/v1/admin/versions/1/load")
        rolled = admin_post(restarted, "/v1/admin/policy/rollback")
        assert rolled["policy"]["stable"] == 1
        assert predict(restarted)["model_version"] == "1"


def test_the_canary_is_sticky_per_api_key(lifecycle_triton: EmbeddedTriton) -> None:
    keys = [new_key(("infer",)) for _ in range(16)]
    with running_gateway(
        lifecycle_triton.grpc_url, extra_key_entries=tuple(entry for _, entry in keys)
    ) as gateway:
        admin_post(gateway, "/v1/admin/versions/1/load")
        admin_post(gateway, "/v1/admin/versions/2/load")
        admin_post(gateway, "/v1/admin/policy/replace", stable=1, canary=2, canary_percent=50)
        seen = {
            key: {predict(gateway, key=key)["model_version"] for _ in range(3)} for key, _ in keys
        }
        assert all(len(versions) == 1 for versions in seen.values()), seen
        assert {next(iter(v)) for v in seen.values()} == {"1", "2"}
        # A pin overrides the split.
        assert predict(gateway, key=keys[0][0], model_version="2")["model_version"] == "2"


def test_a_bad_canary_is_rolled_back_and_no_caller_sees_it_fail(
    lifecycle_triton: EmbeddedTriton,
) -> None:
    with running_gateway(lifecycle_triton.grpc_url, canary_min_requests=10) as gateway:
        admin_post(gateway, "/v1/admin/versions/1/load")
        admin_post(gateway, "/v1/admin/policy/replace", stable=1)
        loaded = admin_post(gateway, f"/v1/admin/versions/{FAULTY}/load")
        assert loaded["manifest"]["fault"] == "error"
        admin_post(gateway, "/v1/admin/policy/canary", version=FAULTY, percent=100)
        served_faults[FAULTY].touch()  # it goes bad now
        answers = [predict(gateway)["model_version"] for _ in range(12)]
        assert set(answers) == {"1"}  # each canary failure was answered by stable

        def rolled_back() -> bool:
            with gateway.client(key="admin") as client:
                return client.get("/v1/admin/policy").json()["policy"]["canary"] is None

        wait_for(rolled_back, what="the automatic rollback")
        with gateway.client(key="admin") as client:
            policy = client.get("/v1/admin/policy").json()["policy"]
        assert policy["updated_by"] == "canary-guard"
        assert f"canary v{FAULTY} error rate" in policy["reason"]
        assert gateway.metric("gateway_canary_rollbacks_total", reason="error_rate") == 1
        assert model_statistics(lifecycle_triton, f"text_regression_v{FAULTY}")["fail"] >= 10
        failures = gateway.metric(
            "gateway_version_requests_total",
            model="text_regression",
            version="1",
            role="stable",
            outcome="error",
        )
        assert failures == 0
        # Leave the module's Triton as it was: the fault off, the version unloaded.
        served_faults[FAULTY].unlink()
        with gateway.client(key="admin", timeout=None) as client:
            assert client.delete(f"/v1/admin/versions/{FAULTY}").status_code == 200


def test_the_admin_api_refuses_an_infer_key(lifecycle_triton: EmbeddedTriton) -> None:
    with running_gateway(lifecycle_triton.grpc_url) as gateway, gateway.client() as client:
        refused = client.post("/v1/admin/versions/2/load")
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"
        with gateway.client(key="admin") as admin:
            assert admin.post("/v1/predict", json={"texts": TEXTS}).status_code == 403
