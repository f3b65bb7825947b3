"""Per-key rate limits: token buckets, 429 with Retry-After and the RateLimit fields."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway import errors
from gateway.auth import KeyRing, hash_key
from gateway.metrics import GatewayMetrics
from gateway.rate_limit import RateLimit, RateLimiter, TokenBucket
from tests.unit.conftest import unit_gateway


def test_a_bucket_allows_its_burst_then_refills_at_its_rate() -> None:
    bucket = TokenBucket(RateLimit(rate=2, burst=3), now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.retry_after_s() == 1
    assert not bucket.take(0.4)  # 0.8 of a token
    assert bucket.take(0.5)  # one token after half a second at 2/s
    assert bucket.take(10.0) and bucket.tokens == 2  # capped at the burst (3), minus one


@pytest.mark.parametrize(
    ("text", "limit"),
    [("5", RateLimit(5, 10)), ("0.5/3", RateLimit(0.5, 3)), ("0.2", RateLimit(0.2, 1))],
)
def test_limits_parse(text: str, limit: RateLimit) -> None:
    assert RateLimit.parse(text) == limit


@pytest.mark.parametrize("text", ["0", "-1", "x", "5/0", "inf", "nan", "5/x"])
def test_bad_limits_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="rate limit"):
        RateLimit.parse(text)


def test_key_entries_carry_their_limit() -> None:
    ring = KeyRing([f"{hash_key('a')}:infer:5/7", f"{hash_key('b')}:infer"])
    assert ring.authenticate("a").rate_limit == RateLimit(5, 7)
    assert ring.authenticate("b").rate_limit is None


def test_keys_have_buckets_of_their_own() -> None:
    limiter = RateLimiter(RateLimit(1, 1), GatewayMetrics(CollectorRegistry()))
    limiter.check("key-a", None)
    with pytest.raises(errors.RateLimited):
        limiter.check("key-a", None)
    limiter.check("key-b", None)  # another key is not starved
    assert limiter.check("key-c", RateLimit(100, 100))["RateLimit-Policy"] == '"per-key";q=100;w=1'


async def test_a_limited_key_gets_429_with_the_standard_fields() -> None:
    async with unit_gateway(default_rate_limit=1, default_rate_burst=2) as gateway:
        answers = [
            await gateway.client.post("/v1/predict", json={"texts": ["hi"]}, headers=gateway.auth)
            for _ in range(3)
        ]
        assert [answer.status_code for answer in answers] == [200, 200, 429]
        assert answers[0].headers["ratelimit-policy"] == '"per-key";q=2;w=2'
        assert answers[0].headers["ratelimit"].startswith('"per-key";r=1;')
        refused = answers[2]
        assert refused.json()["error"]["code"] == "rate_limited"
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["ratelimit"].startswith('"per-key";r=0;')
        # The refused request cost Triton nothing.
        assert len(gateway.triton.infer_calls()) == 2
        listing = await gateway.client.get("/v1/models", headers=gateway.auth)
        assert listing.status_code == 429
