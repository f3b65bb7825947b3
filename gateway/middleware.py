"""Pure-ASGI middleware: request id, body-size limit, Server-Timing, in-flight gauge, access log,
and the answer to an unexpected exception.

Pure ASGI (not BaseHTTPMiddleware) so the route sees the real ``receive`` and can notice a client
that disconnects, and so a body can be refused before it is read in full.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import errors
from gateway.context import RequestTimings, request_id_var, timings_var
from gateway.error_handlers import error_response
from gateway.metrics import GatewayMetrics

log = logging.getLogger("gateway.access")
log_errors = logging.getLogger("gateway.errors")
# The status access logs use for a client that closed the connection before the answer (nginx's).
CLIENT_CLOSED_REQUEST = 499
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the already-read body once, then listens to the client again."""
    delivered = False

    async def replay_receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay_receive


class RequestContextMiddleware:
    """Wraps every HTTP request with its id, timings, limits and one access-log line."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, metrics: GatewayMetrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope["headers"]
        }
        incoming_id = headers.get("x-request-id", "")
        request_id = incoming_id if _VALID_REQUEST_ID.match(incoming_id) else uuid.uuid4().hex
        id_token = request_id_var.set(request_id)
        timings = RequestTimings()
        timings_token = timings_var.set(timings)
        started = time.perf_counter()
        # The status sent, once the response has started.
        status: dict[str, int] = {}
        counts_in_flight = scope["path"].startswith("/v1/")
        if counts_in_flight:
            self.metrics.in_flight.inc()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                total_ms = (time.perf_counter() - started) * 1000
                triton_ms = timings.triton_seconds * 1000
                extra = [
                    (b"x-request-id", request_id.encode()),
                    (
                        b"server-timing",
                        f"gateway;dur={max(0.0, total_ms - triton_ms):.2f}, triton;dur={triton_ms:.2f}".encode(),
                    ),
                ]
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        try:
            declared = headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                await self._refuse_too_large(scope, receive, send_with_headers)
                return
            if scope["method"] in ("POST", "PUT", "PATCH"):
                body = await self._read_body(receive)
                if body is None:
                    await self._refuse_too_large(scope, receive, send_with_headers)
                    return
                receive = _replay(body, receive)
            try:
                await self.app(scope, receive, send_with_headers)
            except errors.ClientDisconnected:
                # An ordinary event (its Triton calls were cancelled); the access line says 499.
                status.setdefault("code", CLIENT_CLOSED_REQUEST)
            except Exception:
                # Answered here, inside the request's context, so the 500 carries its request id
                # and the traceback is logged once (Starlette's outer handler would log it again).
                log_errors.exception("unhandled error")
                if "code" in status:
                    raise  # the response had started: nothing can be answered any more
                internal = errors.InternalError(
                    "internal error; see the gateway log for this request id"
                )
                await error_response(internal)(scope, receive, send_with_headers)
        finally:
            if counts_in_flight:
                self.metrics.in_flight.dec()
            log.info(
                "request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status.get("code", 500),
                    "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                    "triton_ms": round(timings.triton_seconds * 1000, 2),
                },
            )
            timings_var.reset(timings_token)
            request_id_var.reset(id_token)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it grows past the limit (chunked bodies included)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)  # disconnected: the app will notice on its own
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse_too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        too_large = errors.PayloadTooLarge(f"request body exceeds {self.max_body_bytes} bytes")
        await error_response(too_large)(scope, receive, send)
