"""Swagger UI (``/docs``) and ReDoc (``/redoc``) served from packaged assets, with no CDN.

FastAPI's default pages load their JavaScript, CSS and favicon from a public CDN (and ReDoc's
fonts from Google), so on an air-gapped host they stay blank. The ``fastapi-offline`` package
ships those files; only its ``static`` folder is used here, mounted under ``/docs/static``, and
the pages are built with FastAPI's own HTML helpers pointing at it.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
REDOC_URL = "/redoc"
STATIC_URL = "/docs/static"
ASSETS_PACKAGE = ("fastapi_offline", "static")
SWAGGER_JS = "swagger-ui-bundle.js"
SWAGGER_CSS = "swagger-ui.css"
REDOC_JS = "redoc.standalone.js"
FAVICON = "favicon.png"
# The bundles hold a few absolute URLs of their own: Swagger UI's validator badge (turned off
# below) and ReDoc's "API docs by Redocly" logo. The browser is told to load images from this
# host only, so the docs pages never reach out, not even a DNS lookup an egress monitor flags.
CONTENT_SECURITY_POLICY = "img-src 'self' data:"


def _root_path(request: Request) -> str:
    """The prefix a proxy serves the gateway under (``--root-path``), as FastAPI's pages use it."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


def install_api_docs(app: FastAPI) -> None:
    """Serve Swagger UI at ``/docs`` and ReDoc at ``/redoc`` from local assets.

    Create the app with ``docs_url=None, redoc_url=None`` so FastAPI's CDN pages are not
    registered too. The pages need no API key and stay out of the OpenAPI document.
    """
    assert app.openapi_url is not None, "the docs pages render the app's OpenAPI document"
    openapi_url = app.openapi_url
    # Swagger UI's default validatorUrl sends the document to an external validator host.
    swagger_parameters = {**(app.swagger_ui_parameters or {}), "validatorUrl": None}
    app.mount(STATIC_URL, StaticFiles(packages=[ASSETS_PACKAGE]), name="api-docs-static")

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root_path(request)
        return _with_policy(
            get_swagger_ui_html(
                openapi_url=root + openapi_url,
                title=f"{app.title} - Swagger UI",
                oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
                swagger_js_url=f"{root}{STATIC_URL}/{SWAGGER_JS}",
                swagger_css_url=f"{root}{STATIC_URL}/{SWAGGER_CSS}",
                swagger_favicon_url=f"{root}{STATIC_URL}/{FAVICON}",
                swagger_ui_parameters=swagger_parameters,
            )
        )

    async def swagger_ui_oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        root = _root_path(request)
        return _with_policy(
            get_redoc_html(
                openapi_url=root + openapi_url,
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{root}{STATIC_URL}/{REDOC_JS}",
                redoc_favicon_url=f"{root}{STATIC_URL}/{FAVICON}",
                # Google Fonts is a CDN too; ReDoc falls back to the browser's sans-serif.
                with_google_fonts=False,
            )
        )

    app.add_api_route(DOCS_URL, swagger_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route(
        OAUTH2_REDIRECT_URL, swagger_ui_oauth2_redirect, methods=["GET"], include_in_schema=False
    )
    app.add_api_route(REDOC_URL, redoc, methods=["GET"], include_in_schema=False)
