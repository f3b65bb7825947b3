"""Per-request context shared by middleware, logs, errors and the service."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class RequestTimings:
    """Time a request spent waiting on Triton (for Server-Timing and the access log)."""

    triton_seconds: float = 0.0


request_id_var: ContextVar[str] = ContextVar("request_id", default="-")
timings_var: ContextVar[RequestTimings | None] = ContextVar("timings", default=None)
