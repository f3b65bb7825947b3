"""The committed OpenAPI document is current, complete, and generates a working Python SDK."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.app import create_app
from gateway.settings import Settings
from tests.conftest import ROOT
from tests.gateway_support import RunningGateway

COMMITTED = ROOT / "docs" / "openapi.json"


def current_document() -> dict[str, Any]:
    document: dict[str, Any] = create_app(Settings(_env_file=None)).openapi()
    return document


def test_committed_document_is_current() -> None:
    committed = json.loads(COMMITTED.read_text())
    assert committed == json.loads(json.dumps(current_document())), (
        "docs/openapi.json is stale: run `make openapi` and commit it"
    )


def test_operations_are_stable_documented_and_secured() -> None:
    document = current_document()
    operations = {
        (path, method): operation
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    }
    assert {op["operationId"] for op in operations.values()} == {
        "predict", "embed", "listModels", "livez", "readyz", "metrics",
        "listVersions", "loadVersion", "unloadVersion", "getPolicy", "replacePolicy",
        "setCanary", "setShadow", "promoteCanary", "rollback",
    }  # fmt: skip
    schemes = document["components"]["securitySchemes"]
    assert schemes["BearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "Authorization: Bearer <key>",
    }
    assert schemes["ApiKeyAuth"]["name"] == "X-API-Key"
    error_ref = "#/components/schemas/ErrorResponse"
    for path in ("/v1/predict", "/v1/embed"):
        operation = operations[(path, "post")]
        assert operation["security"] == [{"BearerAuth": []}, {"ApiKeyAuth": []}]
        for status in ("400", "401", "403", "404", "413", "422", "502", "503", "504"):
            schema = operation["responses"][status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": error_ref}, f"{path} {status}"
        request_schema = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        name = request_schema.rsplit("/", 1)[1]
        assert document["components"]["schemas"][name].get("examples"), f"{name} has no example"
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for (path, _), operation in operations.items():
        if path.startswith("/v1/admin/"):
            assert operation["tags"] == ["admin"], path
            assert operation["security"] == [{"BearerAuth": []}, {"ApiKeyAuth": []}], path
            assert {"401", "403"} <= set(operation["responses"]), path


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Python client generated from the committed document by openapi-python-client."""
    output = tmp_path_factory.mktemp("sdk") / "client"
    generator = Path(sys.executable).parent / "openapi-python-client"
    subprocess.run(
        [
            str(generator),
            "generate",
            "--path",
            str(COMMITTED),
            "--output-path",
            str(output),
            "--meta",
            "none",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    sys.path.insert(0, str(output.parent))
    try:
        yield importlib.import_module(output.name)
    finally:
        sys.path.remove(str(output.parent))


def test_generated_sdk_round_trip(gateway: RunningGateway, sdk: Any) -> None:
    predict = importlib.import_module(f"{sdk.__name__}.api.inference.predict")
    embed = importlib.import_module(f"{sdk.__name__}.api.inference.embed")
    models = importlib.import_module(f"{sdk.__name__}.models")

    with (
        sdk.AuthenticatedClient(base_url=gateway.base_url, token=gateway.infer_key) as client,
        sdk.Client(base_url=gateway.base_url) as anonymous,
    ):
        body = models.PredictRequest(texts=["Great kettle.", "Awful."])
        scored = predict.sync_detailed(client=client, body=body)
        assert scored.status_code == 200
        assert isinstance(scored.parsed, models.PredictResponse) and len(scored.parsed.scores) == 2

        vectors = embed.sync(client=client, body=models.EmbedRequest(texts=["Great kettle."]))
        assert isinstance(vectors, models.EmbedResponse)
        assert vectors.dimension == len(vectors.embeddings[0])

        denied = predict.sync_detailed(client=anonymous, body=models.PredictRequest(texts=["x"]))
        assert denied.status_code == 401
        assert isinstance(denied.parsed, models.ErrorResponse)
        assert denied.parsed.error.code == "unauthorized"

        invalid = predict.sync_detailed(client=client, body=models.PredictRequest(texts=["   "]))
        assert invalid.status_code == 422
        assert isinstance(invalid.parsed, models.ErrorResponse)
        assert invalid.parsed.error.code == "invalid_request"


def test_generated_sdk_drives_the_admin_api(gateway: RunningGateway, sdk: Any) -> None:
    list_versions = importlib.import_module(f"{sdk.__name__}.api.admin.list_versions")
    get_policy = importlib.import_module(f"{sdk.__name__}.api.admin.get_policy")
    models = importlib.import_module(f"{sdk.__name__}.models")
    with (
        sdk.AuthenticatedClient(base_url=gateway.base_url, token=gateway.admin_only_key) as admin,
        sdk.AuthenticatedClient(base_url=gateway.base_url, token=gateway.infer_key) as infer,
    ):
        listed = list_versions.sync(client=admin)
        assert isinstance(listed, models.VersionsResponse)
        assert [(v.version, v.state, v.roles) for v in listed.versions][:1] == [
            (1, "ready", ["stable"])
        ]
        policy = get_policy.sync(client=admin)
        assert isinstance(policy, models.PolicyResponse) and policy.policy.stable == 1
        denied = list_versions.sync_detailed(client=infer)
        assert denied.status_code == 403
        assert isinstance(denied.parsed, models.ErrorResponse)
