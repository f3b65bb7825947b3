"""The Grafana dashboard and the metric names it queries.

Every query must name a metric that the gateway or Triton really exports. The expected names live
in the two lists below, so the dashboard check works on its own; two live tests hold the lists to
what a real embedded Triton and the real gateway app export.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest

from devtools.triton import EmbeddedTriton
from tests.deploy_files import DASHBOARD_FILE, GATEWAY_PATHS, GRAFANA_PROVISIONING, load_yaml

# name on the "# TYPE" line -> type. The gateway's metrics: prometheus-fastapi-instrumentator's
# three and the gateway's own (the contract of gateway.app, written by the lead).
GATEWAY_METRICS = {
    "http_requests_total": "counter",
    "http_request_duration_seconds": "histogram",
    "http_request_duration_highr_seconds": "histogram",
    "gateway_triton_request_duration_seconds": "histogram",
    "gateway_texts_per_request": "histogram",
    "gateway_triton_errors_total": "counter",
    "gateway_requests_in_flight": "gauge",
    "gateway_ready": "gauge",
    "gateway_shm_regions_in_use": "gauge",
    "gateway_shm_region_waits_total": "counter",
    "gateway_shm_fallbacks_total": "counter",
    "gateway_admission_in_flight_texts": "gauge",
    "gateway_admission_queued_texts": "gauge",
    "gateway_admission_limit_texts": "gauge",
    "gateway_admission_wait_seconds": "histogram",
    "gateway_admission_decisions_total": "counter",
    "gateway_rate_limited_total": "counter",
    "gateway_version_requests_total": "counter",
    "gateway_version_request_duration_seconds": "histogram",
    "gateway_canary_rollbacks_total": "counter",
    "gateway_traffic_policy_revision": "gauge",
    "gateway_traffic_share_percent": "gauge",
    "gateway_shadow_requests_total": "counter",
    "gateway_shadow_drift": "histogram",
}
# What tritonserver 2.51 (NGC 24.10, and the embedded server of the same version) exports on any
# machine, as read from a running embedded server.
TRITON_METRICS = {
    "nv_inference_request_success": "counter",
    "nv_inference_request_failure": "counter",
    "nv_inference_count": "counter",
    "nv_inference_exec_count": "counter",
    "nv_inference_request_duration_us": "counter",
    "nv_inference_queue_duration_us": "counter",
    "nv_inference_compute_input_duration_us": "counter",
    "nv_inference_compute_infer_duration_us": "counter",
    "nv_inference_compute_output_duration_us": "counter",
    "nv_inference_pending_request_count": "gauge",
    "nv_pinned_memory_pool_total_bytes": "gauge",
    "nv_pinned_memory_pool_used_bytes": "gauge",
    "nv_cpu_utilization": "gauge",
    "nv_cpu_memory_total_bytes": "gauge",
    "nv_cpu_memory_used_bytes": "gauge",
}
# Exported only where Triton finds a GPU (through DCGM), so the live test on this CPU-only
# machine cannot see them; names from Triton's metrics documentation.
TRITON_GPU_ONLY_METRICS = {
    "nv_gpu_utilization": "gauge",
    "nv_gpu_memory_total_bytes": "gauge",
    "nv_gpu_memory_used_bytes": "gauge",
}

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "inf", "nan", "le",
}  # fmt: skip


def sample_names(families: dict[str, str]) -> set[str]:
    """Names a query can use: histograms add _bucket/_sum/_count to the family name."""
    names = set()
    for name, kind in families.items():
        names.add(name)
        if kind in ("histogram", "summary"):
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    return names


def promql_metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, ranges, functions,
    grouping clauses and keywords removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", text):
        name, is_call = match.group(1), match.group(2)
        if not is_call and name not in PROMQL_KEYWORDS:
            names.add(name)
    return names


def parse_type_lines(exposition: str) -> dict[str, str]:
    """``# TYPE name kind`` lines of a Prometheus text exposition."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M))


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD_FILE.read_text()))


def graph_panels() -> list[dict[str, Any]]:
    """The panels that query something: a ``row`` panel only groups the ones below it."""
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def queries() -> list[str]:
    return [target["expr"] for panel in graph_panels() for target in panel["targets"]]


def test_promql_metric_names_finds_selectors_only() -> None:
    expression = (
        'histogram_quantile(0.99, sum by (le, model) (rate(foo_bucket{status=~"5..", a="b"}[5m])))'
        " / on (model) group_left sum without (instance) (bar_total offset 5m) > bool 0"
    )
    assert promql_metric_names(expression) == {"foo_bucket", "bar_total"}


def test_dashboard_queries_only_metrics_that_are_exported() -> None:
    known = sample_names(GATEWAY_METRICS | TRITON_METRICS | TRITON_GPU_ONLY_METRICS)
    for expression in queries():
        names = promql_metric_names(expression)
        assert names, f"no metric in {expression!r}"
        assert names <= known, f"{sorted(names - known)} exported by nothing: {expression!r}"


def test_dashboard_covers_what_operators_need() -> None:
    expressions = queries()
    joined = "\n".join(expressions)
    for metric in [
        "http_requests_total",
        "http_request_duration_highr_seconds_bucket",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "gateway_shm_regions_in_use",
    ]:
        assert metric in joined, f"no panel shows {metric}"
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}, " in joined
    assert any(
        "nv_inference_count" in e and "/" in e and "nv_inference_exec_count" in e
        for e in expressions
    ), "average batch size is nv_inference_count / nv_inference_exec_count"
    assert any('status=~"5.."' in e for e in expressions), "an error-rate panel"


def test_dashboard_has_a_rollout_row_per_pipeline_version() -> None:
    panels = dashboard()["panels"]
    rows = [panel for panel in panels if panel["type"] == "row"]
    assert [row["title"] for row in rows] == ["Rollout"]
    below = [panel for panel in panels if panel["gridPos"]["y"] > rows[0]["gridPos"]["y"]]
    joined = "\n".join(target["expr"] for panel in below for target in panel["targets"])
    for needed in [
        "sum by (version, role) (rate(gateway_version_requests_total",
        'gateway_version_requests_total{outcome="error"}',
        "histogram_quantile(0.99, sum by (le, version) "
        "(rate(gateway_version_request_duration_seconds_bucket",
        "gateway_traffic_share_percent",
        "increase(gateway_canary_rollbacks_total[5m])",
        "histogram_quantile(0.5, sum by (le, model) (rate(gateway_shadow_drift_bucket",
        "histogram_quantile(0.99, sum by (le, model) (rate(gateway_shadow_drift_bucket",
        "gateway_shadow_requests_total",
    ]:
        assert needed in joined, f"the Rollout row lacks {needed}"


def test_dashboard_is_valid_grafana_json_on_the_provisioned_data_source() -> None:
    board = dashboard()
    source = load_yaml(GRAFANA_PROVISIONING / "datasources" / "prometheus.yml")["datasources"][0]
    assert board["uid"] and board["title"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in graph_panels():
        assert panel["datasource"] == {"type": source["type"], "uid": source["uid"]}
        assert panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]


def test_embedded_triton_exports_the_expected_metrics(triton: EmbeddedTriton) -> None:
    with urllib.request.urlopen(triton.metrics_url, timeout=5) as answer:
        exported = parse_type_lines(answer.read().decode())
    missing = {name: kind for name, kind in TRITON_METRICS.items() if exported.get(name) != kind}
    assert not missing, f"expected but not exported (or of another type): {missing}"


def test_gateway_app_exports_the_expected_metrics() -> None:
    # Needs gateway.app (the lead's work); fails with ModuleNotFoundError until it lands.
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.settings import Settings

    client = TestClient(create_app(Settings()))
    answer = client.get("/metrics")
    assert answer.status_code == 200
    exported = parse_type_lines(answer.text)
    missing = {name: kind for name, kind in GATEWAY_METRICS.items() if exported.get(name) != kind}
    assert not missing, f"expected but not exported (or of another type): {missing}"


@pytest.mark.parametrize("path", GATEWAY_PATHS)
def test_gateway_app_serves_the_paths_the_stack_uses(path: str) -> None:
    from gateway.app import create_app
    from gateway.settings import Settings

    # The OpenAPI document lists every route, including those of included routers.
    paths = create_app(Settings(_env_file=None)).openapi()["paths"]
    assert path in paths
