"""Per-request context shared by middleware, logs, errors and the Triton client."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class RequestTimings:
    """Time a request spent waiting on Triton (for Server-Timing and metrics)."""

    triton_seconds: float = 0.0
    triton_calls: int = 0
    transports: set[str] = field(default_factory=set)


request_id_var: ContextVar[str] = ContextVar("request_id", default="-")
timings_var: ContextVar[RequestTimings | None] = ContextVar("timings", default=None)
