"""The request-context middleware on its own: disconnects and unexpected exceptions."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry
from starlette.types import Message, Receive, Scope, Send

from gateway import errors
from gateway.metrics import GatewayMetrics
from gateway.middleware import CLIENT_CLOSED_REQUEST, RequestContextMiddleware

SCOPE: Scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": []}


async def run(app_error: Exception) -> list[Message]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise app_error

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = RequestContextMiddleware(app, 1024, GatewayMetrics(CollectorRegistry()))
    await middleware(SCOPE, receive, send)
    return sent


async def test_a_client_disconnect_is_an_ordinary_event(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        sent = await run(errors.ClientDisconnected())
    assert sent == []  # nobody to answer
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    (access,) = [record for record in caplog.records if record.name == "gateway.access"]
    assert access.__dict__["status"] == CLIENT_CLOSED_REQUEST


async def test_an_unexpected_exception_is_logged_once_and_answered_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        sent = await run(RuntimeError("a bug"))
    assert sent[0]["status"] == 500
    assert (b"x-request-id", sent[0]["headers"][-2][1]) in sent[0]["headers"]
    errors_logged = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors_logged) == 1 and errors_logged[0].exc_info is not None
