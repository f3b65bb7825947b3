"""The app conforms to the OpenAPI document it publishes: schemathesis, every check, zero failures.

The unit layer's app (the real app over a fake Triton, in process through ASGI, no server) with
its own limits, fuzzed from its own ``/openapi.json`` with a fixed seed: the examples, coverage
(boundary and negative values, unexpected methods) and fuzzing phases, positive and negative
data, with a valid API key (schemathesis also sends requests without it: ``ignored_auth``). The
stateful phase has nothing to chain here (no operation's output is another's input); the big run
against the live gateway in docs/benchmarks.md ran it.
"""

from __future__ import annotations

import time
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig

from gateway.app import create_app
from gateway.auth import new_key
from gateway.settings import Settings
from tests.unit.fake_triton import FakeTriton

# Cases per operation in the fuzzing phase (15 operations; the examples and coverage phases add
# their own few hundred). Sized for CI: about 40 s on 2 cores.
MAX_EXAMPLES = 120
SEED = 20261130


def conformance_config(key: str) -> SchemathesisConfig:
    """All checks, positive and negative data, a fixed seed, the key for both API-key schemes."""
    return SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "generation": {
                "mode": "all",
                "max-examples": MAX_EXAMPLES,
                "deterministic": True,
                # No example database: nothing written under the work tree, same cases every run.
                "database": "none",
            },
            "checks": {
                "enabled": True,
                # 504 upstream_timeout is the documented answer to a deadline that passed before
                # the call reached Triton: X-Request-Timeout's minimum (1 ms) can pass while a
                # busy CI machine routes the request (as in the live run, docs/benchmarks.md).
                "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "504"]},
            },
            # Whether a policy change or a load is valid depends on the state (which versions
            # exist and are loaded, what the policy is): a schema-valid body there may be 404,
            # 409 or 422, each documented. Everywhere else valid data must be accepted.
            "operations": [
                {
                    "include-path-regex": "^/v1/admin/",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                        }
                    },
                }
            ],
            "phases": {
                "coverage": {
                    # Schemathesis 4.32 reads a number-typed header (X-Request-Timeout: 0.001) as
                    # the string it is on the wire, so a case that only adds an unknown header
                    # looks like "other negation" to negative_data_rejection: a false failure
                    # (HTTP lets clients send any header, and the gateway must ignore unknown
                    # ones). The fuzzing phase still sends unexpected properties (body included).
                    "generation": {"allow-extra-parameters": False},
                },
            },
            "auth": {
                "openapi": {
                    "BearerAuth": {"bearer": key},
                    "ApiKeyAuth": {"api_key": key},
                }
            },
        }
    )


# Both scopes: the admin operations are fuzzed past their 403 (load, unload, policy changes on
# the fake's versions answer 200, 404, 409 or 422, each documented).
KEY, KEY_ENTRY = new_key(("infer", "admin"))
SETTINGS = Settings(
    _env_file=None,
    api_keys=[KEY_ENTRY],
    health_interval_s=0.02,
    max_texts_per_request=16,
    max_text_chars=64,
    # Room for any body the document allows (16 texts of 64 code points, each up to 12 bytes as
    # JSON: an escaped surrogate pair), so the body limit (413) never refuses a valid body.
    max_body_bytes=64 * 1024,
)
APP = create_app(SETTINGS, client=FakeTriton())
# The document the app serves at /openapi.json, read without starting the app (from_asgi would
# start its lifespan at collection, even in a run that deselects this test). Requests go to the
# app in process, as from_asgi sets them up: schemathesis starts the lifespan on a test's first
# request and its pytest plugin ends it when the test ends.
schema = schemathesis.openapi.from_dict(APP.openapi(), config=conformance_config(KEY))
schema.app = APP


@pytest.fixture(autouse=True)
def ready_app() -> None:
    """Start the app (its lifespan) and wait for its warm-up: inference is 503 until then."""
    readyz = schema["/readyz"]["GET"]
    deadline = time.monotonic() + 10
    while readyz.Case().call().status_code != 200:
        assert time.monotonic() < deadline, "the app did not become ready"
        time.sleep(0.01)


@schema.parametrize()
@hypothesis.settings(
    suppress_health_check=list(hypothesis.HealthCheck), deadline=None, print_blob=False
)
def test_the_app_conforms_to_its_document(case: Any) -> None:
    case.call_and_validate()
