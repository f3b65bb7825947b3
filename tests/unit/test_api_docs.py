"""/docs and /redoc work with no network: every script, style and icon comes from the gateway.

No Triton: the TestClient is never entered as a context manager, so the lifespan (which connects
to Triton) does not run; the docs pages do not need it.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.auth import new_key
from gateway.settings import Settings

# A scheme ("https:", "data:") or a protocol-relative "//host" makes a URL non-local.
NOT_LOCAL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//)")
QUOTED = re.compile(r"""'([^'\\]*)'|"([^"\\]*)\"""")
ASSET_TYPES = {
    ".js": ("text/javascript", "application/javascript"),
    ".css": ("text/css",),
    ".png": ("image/png",),
}
# The smallest believable size of each kind: the bundles are over 1 MB, the stylesheet ~180 kB.
MIN_BYTES = {".js": 500_000, ".css": 50_000, ".png": 1_000}


class PageParts(HTMLParser):
    """The ``src``/``href``/``spec-url`` attributes and the inline scripts of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline_scripts: list[str] = []
        self._in_inline_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("src", "href", "spec-url"):
            value = values.get(name)
            if value is not None:
                self.urls.append(value)
        self._in_inline_script = tag == "script" and "src" not in values

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_inline_script = False

    def handle_data(self, data: str) -> None:
        if self._in_inline_script and data.strip():
            self.inline_scripts.append(data)


def settings(**overrides: Any) -> Settings:
    """Settings from the defaults and ``overrides``, never from a developer's ``.env``."""
    return Settings(_env_file=None, **overrides)


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(settings())


@pytest.fixture(scope="module")
def client(app: FastAPI) -> TestClient:
    return TestClient(app)


def page_parts(client: TestClient, path: str) -> PageParts:
    """The parts of the HTML page at ``path``, which must answer 200."""
    response = client.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    parts = PageParts()
    parts.feed(response.text)
    parts.close()
    return parts


def string_literals(script: str) -> list[str]:
    """The quoted strings of a script: where its URLs would be."""
    return [single or double for single, double in QUOTED.findall(script)]


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_page_references_only_local_urls(client: TestClient, path: str) -> None:
    page = client.get(path).text
    parts = page_parts(client, path)
    assert parts.urls, f"{path} references no asset"
    for url in parts.urls:
        assert url.startswith("/") and not NOT_LOCAL.match(url), f"{path}: {url!r} is not local"
    for script in parts.inline_scripts:
        for literal in string_literals(script):
            assert not NOT_LOCAL.match(literal), f"{path}: inline script names {literal!r}"
    assert "http://" not in page and "https://" not in page, page


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_every_referenced_asset_is_served(client: TestClient, path: str) -> None:
    assets = [url for url in page_parts(client, path).urls if url.startswith("/docs/static/")]
    suffixes = {url[url.rfind(".") :] for url in assets}
    assert {".js", ".png"} <= suffixes, assets
    for url in assets:
        suffix = url[url.rfind(".") :]
        response = client.get(url)
        assert response.status_code == 200, url
        assert response.headers["content-type"].startswith(ASSET_TYPES[suffix]), (
            url,
            response.headers["content-type"],
        )
        assert len(response.content) >= MIN_BYTES[suffix], (url, len(response.content))


def test_swagger_ui_loads_its_stylesheet_and_bundle_and_has_no_validator_badge(
    client: TestClient,
) -> None:
    parts = page_parts(client, "/docs")
    assert "/docs/static/swagger-ui.css" in parts.urls
    assert "/docs/static/swagger-ui-bundle.js" in parts.urls
    script = "\n".join(parts.inline_scripts)
    # The online validator badge would send the document to an external host.
    assert '"validatorUrl": null' in script
    assert "url: '/openapi.json'" in script
    assert "'/docs/oauth2-redirect'" in script


def test_redoc_loads_its_bundle_and_the_gateway_document(client: TestClient) -> None:
    parts = page_parts(client, "/redoc")
    assert "/docs/static/redoc.standalone.js" in parts.urls
    assert "/openapi.json" in parts.urls
    assert not any("fonts.googleapis" in url for url in parts.urls)


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_pages_tell_the_browser_to_load_images_from_the_gateway_only(
    client: TestClient, path: str
) -> None:
    # ReDoc's bundle shows Redocly's logo from its CDN; this policy stops that request.
    assert client.get(path).headers["content-security-policy"] == "img-src 'self' data:"


def test_the_documented_spec_lists_the_operations(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    operation_ids = {
        operation["operationId"]
        for operations in document["paths"].values()
        for operation in operations.values()
    }
    assert {"predict", "embed"} <= operation_ids


def test_oauth2_redirect_page_is_served(client: TestClient) -> None:
    response = client.get("/docs/oauth2-redirect")
    assert response.status_code == 200
    assert "swaggerUIRedirectOauth2" in response.text


def test_docs_need_no_api_key_when_keys_are_configured() -> None:
    _, entry = new_key(("infer",))
    keyed = TestClient(create_app(settings(api_keys=[entry])))
    assert keyed.post("/v1/predict", json={"texts": ["x"]}).status_code == 401
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect", "/docs/static/swagger-ui.css"):
        assert keyed.get(path).status_code == 200, path


def test_docs_routes_stay_out_of_the_openapi_document(app: FastAPI) -> None:
    paths = set(app.openapi()["paths"])
    assert not {path for path in paths if path.startswith(("/docs", "/redoc"))}, paths


def test_missing_asset_is_a_json_404(client: TestClient) -> None:
    response = client.get("/docs/static/nothing.js")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_pages_and_assets_follow_the_proxy_root_path(app: FastAPI) -> None:
    # As behind a proxy with `uvicorn --root-path /textscore`: the ASGI path includes the prefix.
    proxied = TestClient(app, root_path="/textscore")
    swagger = page_parts(proxied, "/textscore/docs")
    assert "/textscore/docs/static/swagger-ui-bundle.js" in swagger.urls
    assert "url: '/textscore/openapi.json'" in "\n".join(swagger.inline_scripts)
    redoc = page_parts(proxied, "/textscore/redoc")
    assert "/textscore/docs/static/redoc.standalone.js" in redoc.urls
    for url in swagger.urls + redoc.urls:
        assert proxied.get(url).status_code == 200, url


def test_docs_traffic_stays_out_of_the_http_metrics() -> None:
    # A fresh app: its registry holds only this test's requests.
    fresh = TestClient(create_app(settings()))
    for path in ("/docs", "/redoc", "/docs/static/redoc.standalone.js", "/openapi.json"):
        assert fresh.get(path).status_code == 200, path
    exposition = fresh.get("/metrics").text
    handlers = set(re.findall(r'^http_requests_total\{handler="([^"]*)"', exposition, re.M))
    # /openapi.json proves the instrumentation runs; the docs requests left no series.
    assert handlers == {"/openapi.json"}, handlers
