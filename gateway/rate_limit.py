"""Per-API-key rate limits: a token bucket per key, so one client cannot starve the others.

A key entry may carry its limit after its scopes (``digest:infer:50/100``: 50 requests/s, bursts of
100); ``GATEWAY_DEFAULT_RATE_LIMIT`` covers keys without one. A refusal is a 429 with
``Retry-After``; every answer to a limited key carries the ``RateLimit`` and ``RateLimit-Policy``
fields of the IETF draft (draft-ietf-httpapi-ratelimit-headers-08 and later: ``q`` quota and
``w`` window in the policy, ``r`` remaining and ``t`` seconds to full in the current state).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from gateway import errors
from gateway.metrics import GatewayMetrics

POLICY_NAME = '"per-key"'


@dataclass(frozen=True)
class RateLimit:
    """``rate`` requests per second, in bursts of at most ``burst``."""

    rate: float
    burst: int

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"50"`` or ``"50/100"`` (rate, then burst; the burst defaults to 2 x the rate)."""
        rate_text, _, burst_text = text.partition("/")
        try:
            rate = float(rate_text)
            burst = int(burst_text) if burst_text else None
        except ValueError:
            raise ValueError(f"a rate limit is 'RATE' or 'RATE/BURST', got {text!r}") from None
        if not (math.isfinite(rate) and rate > 0 and (burst is None or burst >= 1)):
            raise ValueError(f"a rate limit needs a positive rate and burst, got {text!r}")
        return cls(rate, cls.default_burst(rate) if burst is None else burst)

    @staticmethod
    def default_burst(rate: float) -> int:
        """Two seconds' worth, at least one request."""
        return max(1, math.ceil(2 * rate))

    @property
    def policy(self) -> str:
        """The ``RateLimit-Policy`` field: the quota and the seconds it takes to refill."""
        return f"{POLICY_NAME};q={self.burst};w={max(1, math.ceil(self.burst / self.rate))}"


class TokenBucket:
    """Holds up to ``burst`` tokens, refilled at ``rate`` per second; a request takes one."""

    def __init__(self, limit: RateLimit, now: float) -> None:
        self.limit = limit
        self.tokens = float(limit.burst)
        self.updated = now

    def take(self, now: float) -> bool:
        """Take a token if there is one."""
        self.tokens = min(
            float(self.limit.burst), self.tokens + (now - self.updated) * self.limit.rate
        )
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def headers(self) -> dict[str, str]:
        """``RateLimit`` and ``RateLimit-Policy`` for the bucket's state now."""
        to_full = math.ceil((self.limit.burst - self.tokens) / self.limit.rate)
        return {
            "RateLimit": f"{POLICY_NAME};r={int(self.tokens)};t={to_full}",
            "RateLimit-Policy": self.limit.policy,
        }

    def retry_after_s(self) -> int:
        """Whole seconds until the next token."""
        return max(1, math.ceil((1 - self.tokens) / self.limit.rate))


class RateLimiter:
    """The buckets of every limited key (keyed by the key's digest)."""

    def __init__(self, default: RateLimit | None, metrics: GatewayMetrics) -> None:
        self.default = default
        self.metrics = metrics
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, key_digest: str, limit: RateLimit | None) -> dict[str, str]:
        """Count one request of the key; the headers to answer with, or RateLimited (429)."""
        limit = limit or self.default
        if limit is None:
            return {}
        now = time.monotonic()
        bucket = self._buckets.get(key_digest)
        if bucket is None or bucket.limit != limit:
            bucket = self._buckets[key_digest] = TokenBucket(limit, now)
        if bucket.take(now):
            return bucket.headers()
        self.metrics.rate_limited.inc()
        raise errors.RateLimited(
            f"rate limit of {limit.rate:g} requests/s (bursts of {limit.burst}) exceeded",
            {"Retry-After": str(bucket.retry_after_s()), **bucket.headers()},
        )
