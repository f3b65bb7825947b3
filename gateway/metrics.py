"""Prometheus metrics: HTTP metrics from prometheus-fastapi-instrumentator plus the gateway's own.

Each app gets its own registry, so several apps (tests) can live in one process.
"""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_fastapi_instrumentator import Instrumentator

# Fine below 100 ms, where p99 of a warm CPU pipeline lives, and out to the deadline.
LATENCY_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.040, 0.050, 0.065, 0.080,
    0.100, 0.125, 0.150, 0.200, 0.250, 0.300, 0.400, 0.500, 0.750, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)  # fmt: skip
TEXT_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# Regexes searched in the route template. The docs pages and their assets (gateway/api_docs.py)
# are not API traffic: a 1.5 MB bundle download would only blur the latency histograms.
UNINSTRUMENTED_PATHS = ["/livez", "/readyz", "/metrics", r"^/docs(/|$)", r"^/redoc$"]


class GatewayMetrics:
    """The gateway's own series, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.triton_latency = Histogram(
            "gateway_triton_request_duration_seconds",
            "Latency of one gateway request's Triton calls, per model and transport",
            ["model", "transport"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.texts_per_request = Histogram(
            "gateway_texts_per_request",
            "Texts in one API request",
            ["route"],
            buckets=TEXT_COUNT_BUCKETS,
            registry=registry,
        )
        self.triton_errors = Counter(
            "gateway_triton_errors_total",
            "Failed Triton calls by gRPC status code",
            ["model", "code"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "API requests being served", registry=registry
        )
        self.ready = Gauge(
            "gateway_ready", "1 when the gateway is ready to take traffic", registry=registry
        )
        self.admission_in_flight = Gauge(
            "gateway_admission_in_flight_texts",
            "Texts sent to Triton and not answered yet, per model",
            ["model"],
            registry=registry,
        )
        self.admission_queued = Gauge(
            "gateway_admission_queued_texts",
            "Texts waiting in the gateway's admission queue, per model",
            ["model"],
            registry=registry,
        )
        self.admission_limit = Gauge(
            "gateway_admission_limit_texts",
            "The in-flight limit now (measured drain rate x target), per model",
            ["model"],
            registry=registry,
        )
        self.admission_wait = Histogram(
            "gateway_admission_wait_seconds",
            "Time admitted requests waited in the admission queue, per model",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.admission_decisions = Counter(
            "gateway_admission_decisions_total",
            "Admission decisions per model: admitted, refused_queue_full, refused_deadline, "
            "refused_expired",
            ["model", "outcome"],
            registry=registry,
        )
        self.rate_limited = Counter(
            "gateway_rate_limited_total",
            "Requests refused with 429 by the per-key rate limit",
            registry=registry,
        )
        self.version_requests = Counter(
            "gateway_version_requests_total",
            "Inference requests per pipeline version, role (stable, canary, pinned) and outcome",
            ["model", "version", "role", "outcome"],
            registry=registry,
        )
        self.version_latency = Histogram(
            "gateway_version_request_duration_seconds",
            "Latency of served requests per pipeline version and role (admission wait included)",
            ["model", "version", "role"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.rollbacks = Counter(
            "gateway_canary_rollbacks_total",
            "Canaries rolled back automatically, by the threshold passed (error_rate, p99)",
            ["reason"],
            registry=registry,
        )
        self.policy_revision = Gauge(
            "gateway_traffic_policy_revision",
            "Revision of the traffic policy applied",
            registry=registry,
        )
        self.traffic_share = Gauge(
            "gateway_traffic_share_percent",
            "Share of the callers each pipeline version serves, by role (shadow: copied share)",
            ["version", "role"],
            registry=registry,
        )
        self.shadow_requests = Counter(
            "gateway_shadow_requests_total",
            "Copies sent to the shadow version: ok, error, or dropped (too many in flight)",
            ["model", "outcome"],
            registry=registry,
        )
        self.shadow_drift = Histogram(
            "gateway_shadow_drift",
            "Shadow vs served answer per text: |score difference| (scores), cosine distance "
            "(embeddings)",
            ["model"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.shm_regions_in_use = Gauge(
            "gateway_shm_regions_in_use",
            "Shared-memory regions held by requests",
            ["transport"],
            registry=registry,
        )
        self.shm_waits = Counter(
            "gateway_shm_region_waits_total",
            "Requests that had to wait for a free shared-memory region",
            ["transport"],
            registry=registry,
        )
        self.shm_fallbacks = Counter(
            "gateway_shm_fallbacks_total",
            "Requests sent over gRPC instead of shared memory, by reason",
            ["transport", "reason"],
            registry=registry,
        )


def instrument(app: FastAPI, registry: CollectorRegistry) -> None:
    """Add the instrumentator's HTTP metrics (health, metrics and docs routes excluded)."""
    Instrumentator(
        excluded_handlers=UNINSTRUMENTED_PATHS,
        should_group_status_codes=False,
        registry=registry,
    ).instrument(app, latency_highr_buckets=LATENCY_BUCKETS, latency_lowr_buckets=LATENCY_BUCKETS)
