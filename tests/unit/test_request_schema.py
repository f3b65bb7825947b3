"""The published request schema says what the gateway enforces: limits, non-blank texts, deadline.

A client (or an SDK generated from the document) that validates a body against /openapi.json must
never be refused for it, and a body the document forbids must be refused (422).
"""

from __future__ import annotations

import sys
from typing import Any

import jsonschema
import pytest

from gateway.app import create_app
from gateway.deps import MIN_REQUEST_TIMEOUT_S
from gateway.schemas import NON_BLANK_PATTERN, is_blank
from gateway.settings import Settings
from tests.unit.conftest import unit_gateway

REQUEST_BODIES = ("PredictRequest", "EmbedRequest")
# Room for 64 texts of 100 characters, so the body limit (413) does not answer first.
ROOMY_BODY_BYTES = 64 * 1024


def texts_schema(document: dict[str, Any], body: str) -> dict[str, Any]:
    """The ``texts`` property of one request body in ``document``."""
    texts: dict[str, Any] = document["components"]["schemas"][body]["properties"]["texts"]
    return texts


async def test_the_document_publishes_this_gateways_limits() -> None:
    async with unit_gateway(max_texts_per_request=7, max_text_chars=33) as gateway:
        response = await gateway.client.get("/openapi.json")
    assert response.status_code == 200
    for body in REQUEST_BODIES:
        texts = texts_schema(response.json(), body)
        assert (texts["minItems"], texts["maxItems"]) == (1, 7), body
        assert texts["items"] == {"type": "string", "maxLength": 33, "pattern": NON_BLANK_PATTERN}


def test_the_default_document_publishes_the_default_limits() -> None:
    defaults = Settings(_env_file=None)
    document = create_app(defaults).openapi()
    for body in REQUEST_BODIES:
        texts = texts_schema(document, body)
        assert texts["maxItems"] == defaults.max_texts_per_request == 512
        assert texts["items"]["maxLength"] == defaults.max_text_chars == 10_000


def test_the_deadline_header_declares_its_minimum() -> None:
    document = create_app(Settings(_env_file=None)).openapi()
    for path in ("/v1/predict", "/v1/embed"):
        (parameter,) = document["paths"][path]["post"]["parameters"]
        assert parameter["name"] == "X-Request-Timeout"
        assert parameter["schema"] == {"type": "number", "minimum": MIN_REQUEST_TIMEOUT_S}


def test_blank_means_python_whitespace_in_the_pattern_and_the_validator() -> None:
    # Every code point: the pattern's class is exactly what str.isspace (and so strip) calls space.
    disagree = [c for c in range(sys.maxunicode + 1) if is_blank(chr(c)) != chr(c).isspace()]
    assert disagree == []
    assert is_blank("") and is_blank(" \t\n\x1c\x85\u3000")
    assert not is_blank("\ufeff") and not is_blank("\u200b") and not is_blank(" a ")


@pytest.mark.parametrize(
    "texts",
    [
        ["a"],
        ["a"] * 64,
        ["a"] * 65,
        [],
        ["x" * 100],
        ["x" * 101],
        ["é" * 100],
        [""],
        [" \t\r\n"],
        ["fine", "  "],
        ["\x1c\x1d\x1e\x1f"],  # whitespace to Python, not to ECMA-262's \s
        ["\x85\xa0\u2028\u3000"],
        ["\ufeff"],  # whitespace to ECMA-262's \s, not to Python: a text
        ["\u200b"],
        ["  padded  "],
    ],
)
async def test_the_gateway_accepts_exactly_what_its_document_allows(texts: list[str]) -> None:
    async with unit_gateway(max_body_bytes=ROOMY_BODY_BYTES) as gateway:
        document = (await gateway.client.get("/openapi.json")).json()
        body = {"texts": texts}
        for route, schema_name in (
            ("/v1/predict", "PredictRequest"),
            ("/v1/embed", "EmbedRequest"),
        ):
            # The body validated against the served document, as a schema-validating client would.
            allowed = jsonschema.Draft202012Validator(
                {
                    "$ref": f"#/components/schemas/{schema_name}",
                    "components": document["components"],
                }
            ).is_valid(body)
            response = await gateway.client.post(route, json=body, headers=gateway.auth)
            assert response.status_code == (200 if allowed else 422), (route, response.text)
            if not allowed:
                assert response.json()["error"]["code"] == "invalid_request"
