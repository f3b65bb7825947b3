"""Model lifecycle over the fake Triton: the policy's routing, its store, the canary guard, and
the admin API (load, canary, promote, rollback, unload, automatic rollback, persistence)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

from gateway import errors
from gateway.auth import new_key
from gateway.lifecycle.guard import CanaryGuard, GuardLimits
from gateway.lifecycle.policy import TrafficPolicy
from gateway.lifecycle.store import FilePolicyStore
from tests.unit.conftest import UnitGateway, unit_gateway
from tests.unit.fake_triton import FakeTriton


def digest(i: int) -> str:
    return hashlib.sha256(f"key-{i}".encode()).hexdigest()


# --- the policy --------------------------------------------------------------------------------


def test_the_canary_share_is_within_a_point_of_its_weight_and_sticky_per_key() -> None:
    policy = TrafficPolicy(revision=1, stable=1).with_canary(2, 10.0, "test")
    choices = [policy.route(digest(i)) for i in range(20_000)]
    share = sum(1 for version, _ in choices if version == 2) / len(choices)
    assert abs(share - 0.10) < 0.01
    assert all(policy.route(digest(i)) == choices[i] for i in range(0, 20_000, 7))
    # Raising the share keeps every canary caller on the canary (buckets only grow).
    wider = policy.with_canary(2, 30.0, "test")
    assert all(wider.route(digest(i))[0] == 2 for i, (v, _) in enumerate(choices) if v == 2)


def test_over_the_known_keys_the_canary_share_is_exact_and_grows_as_a_prefix() -> None:
    keys = [digest(i) for i in range(1000)]
    policy = TrafficPolicy(revision=1, stable=1).with_canary(2, 10.0, "test")
    chosen = policy.canary_callers(keys)
    assert len(chosen) == 100
    assert policy.canary_callers(reversed(keys)) == chosen  # the order keys come in is no input
    assert chosen < policy.with_canary(2, 30.0, "test").canary_callers(keys)
    assert len(policy.with_canary(2, 0.01, "test").canary_callers(keys)) == 1  # at least one
    # Another canary version draws another set (a bad canary's callers are not always the same).
    assert policy.with_canary(3, 10.0, "test").canary_callers(keys) != chosen


def test_promote_and_rollback_move_stable_and_remember_the_previous_one() -> None:
    policy = TrafficPolicy(revision=1, stable=1).with_canary(2, 10.0, "a")
    promoted = policy.promoted("a")
    assert (promoted.stable, promoted.canary, promoted.previous_stable) == (2, None, 1)
    assert promoted.revision == 3
    back = promoted.rolled_back("a")
    assert (back.stable, back.previous_stable) == (1, None)
    with pytest.raises(errors.Conflict):
        back.rolled_back("a")
    with pytest.raises(errors.InvalidRequest):
        TrafficPolicy(revision=1, stable=1).with_canary(1, 5.0, "a")


def test_the_file_store_is_a_compare_and_swap_shared_by_replicas(tmp_path: Path) -> None:
    path = tmp_path / "state" / "policy.json"
    one, two = FilePolicyStore(path), FilePolicyStore(path)
    first = TrafficPolicy(revision=1, stable=1)
    one.swap(None, first)
    assert two.load().policy == first
    second = first.with_canary(2, 10.0, "replica-two")
    two.swap(1, second)
    with pytest.raises(errors.Conflict):
        one.swap(1, first.with_canary(3, 5.0, "replica-one"))  # it read revision 1: stale
    stored = one.load()
    assert stored.policy == second
    assert [item.revision for item in stored.history] == [2, 1]
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy.json", "policy.json.lock"]


def test_the_guard_judges_the_canary_against_stable() -> None:
    guard = CanaryGuard(GuardLimits(30.0, 10, 20, 0.05, 1.5, 0.05))
    now = time.monotonic()
    for _ in range(100):
        guard.record(1, True, 0.020, now)
    for i in range(10):
        guard.record(2, i % 2 == 0, 0.020, now)
    verdict = guard.verdict(1, 2, now)
    assert verdict is not None and verdict.kind == "error_rate" and "50.0%" in verdict.reason
    guard.forget(2)
    for _ in range(19):
        guard.record(2, True, 0.200, now)
    assert guard.verdict(1, 2, now) is None  # 19 samples: too few for a p99
    guard.record(2, True, 0.200, now)
    verdict = guard.verdict(1, 2, now)
    assert verdict is not None and verdict.kind == "p99" and "200 ms" in verdict.reason
    # Old samples leave the window: the verdict is about now.
    assert guard.verdict(1, 2, now + 31) is None


# --- through the app ---------------------------------------------------------------------------


ADMIN_KEY, ADMIN_ENTRY = new_key(("admin",))


def admin(gateway: UnitGateway) -> dict[str, str]:
    return {"X-API-Key": gateway.admin_only_key}


async def predict(gateway: UnitGateway, key: str, **body: Any) -> Any:
    response = await gateway.client.post(
        "/v1/predict", json={"texts": ["abc"], **body}, headers={"X-API-Key": key}
    )
    return response


async def test_admin_routes_need_the_admin_scope() -> None:
    async with unit_gateway(FakeTriton(versions={1, 2})) as gateway:
        for method, path in (
            ("GET", "/v1/admin/versions"),
            ("POST", "/v1/admin/versions/2/load"),
            ("POST", "/v1/admin/policy/promote"),
        ):
            refused = await gateway.client.request(method, path, headers=gateway.auth)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "forbidden"
        assert gateway.triton.lifecycle_calls == []
        listed = await gateway.client.get("/v1/admin/versions", headers=admin(gateway))
        assert listed.status_code == 200
        versions = {item["version"]: item for item in listed.json()["versions"]}
        assert versions[1]["state"] == "ready" and versions[1]["roles"] == ["stable"]
        assert versions[1]["manifest"]["pipeline_version"] == 1
        assert versions[2]["state"] == "available" and versions[2]["manifest"] is None


async def test_a_rollout_load_canary_promote_unload() -> None:
    triton = FakeTriton(versions={1, 2})
    async with unit_gateway(triton) as gateway:
        h = admin(gateway)
        assert (await predict(gateway, gateway.infer_key)).json()["model_version"] == "1"
        refused = await gateway.client.post(
            "/v1/admin/policy/canary", json={"version": 2, "percent": 100}, headers=h
        )
        assert (
            refused.status_code == 409 and "load them first" in refused.json()["error"]["message"]
        )
        loaded = await gateway.client.post("/v1/admin/versions/2/load", headers=h)
        assert loaded.status_code == 200 and loaded.json()["state"] == "ready"
        assert "load text_regression_v2" in triton.lifecycle_calls
        canary = await gateway.client.post(
            "/v1/admin/policy/canary", json={"version": 2, "percent": 100}, headers=h
        )
        assert canary.json()["policy"]["canary"] == 2
        answer = (await predict(gateway, gateway.infer_key)).json()
        assert (answer["model_version"], answer["scores"]) == ("2", [1003.0])
        # A pinned request still reaches the version it names.
        pinned = (await predict(gateway, gateway.infer_key, model_version="1")).json()
        assert (pinned["model_version"], pinned["scores"]) == ("1", [3.0])
        busy = await gateway.client.delete("/v1/admin/versions/1", headers=h)
        assert busy.status_code == 409
        promoted = (await gateway.client.post("/v1/admin/policy/promote", headers=h)).json()
        assert promoted["policy"]["stable"] == 2 and promoted["policy"]["previous_stable"] == 1
        unloaded = await gateway.client.delete("/v1/admin/versions/1", headers=h)
        assert unloaded.status_code == 200, unloaded.text
        assert unloaded.json()["state"] == "available"
        assert "unload text_regression_v1" in triton.lifecycle_calls
        gone = await predict(gateway, gateway.infer_key, model_version="1")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
        history = (await gateway.client.get("/v1/admin/policy", headers=h)).json()["history"]
        assert [item["reason"] for item in history][:2] == [
            "promoted v2 over v1",
            "canary v2 at 100 %",
        ]


async def test_the_gateway_sends_exactly_the_share_of_its_keys_to_the_canary() -> None:
    keys = [new_key(("infer",)) for _ in range(20)]
    async with unit_gateway(
        FakeTriton(versions={1, 2}), api_keys=[entry for _, entry in keys] + [ADMIN_ENTRY]
    ) as gateway:
        h = {"X-API-Key": ADMIN_KEY}
        await gateway.client.post("/v1/admin/versions/2/load", headers=h)
        await gateway.client.post(
            "/v1/admin/policy/canary", json={"version": 2, "percent": 25}, headers=h
        )
        versions = [
            (await predict(gateway, key)).json()["model_version"]
            for key, _ in keys
            for _ in range(2)
        ]
        assert versions.count("2") == 2 * 5  # 25 % of 20 keys, each twice (sticky)
        assert all(versions[i] == versions[i + 1] for i in range(0, len(versions), 2))


async def test_a_failing_canary_is_rolled_back_and_its_callers_are_served_by_stable() -> None:
    triton = FakeTriton(versions={1, 2}, failing_versions={2})
    async with unit_gateway(triton, canary_min_requests=5) as gateway:
        h = admin(gateway)
        # A version whose warm-up fails never takes traffic: the load says why.
        failed = await gateway.client.post("/v1/admin/versions/2/load", headers=h)
        assert failed.status_code == 502, failed.text
        listed = (await gateway.client.get("/v1/admin/versions", headers=h)).json()["versions"]
        assert [v["state"] for v in listed if v["version"] == 2] == ["failed"]
        triton.failing_versions.clear()  # it warms up now; then it goes bad
        assert (
            await gateway.client.post("/v1/admin/versions/2/load", headers=h)
        ).status_code == 200
        await gateway.client.post(
            "/v1/admin/policy/canary", json={"version": 2, "percent": 100}, headers=h
        )
        triton.failing_versions.add(2)
        for _ in range(5):
            answer = await predict(gateway, gateway.infer_key)
            assert answer.status_code == 200 and answer.json()["model_version"] == "1"
        deadline = time.monotonic() + 5
        while (
            policy := (await gateway.client.get("/v1/admin/policy", headers=h)).json()["policy"]
        )["canary"] is not None:
            assert time.monotonic() < deadline, policy
            await _tick()
        assert policy["updated_by"] == "canary-guard"
        assert policy["reason"].startswith("automatic rollback: canary v2 error rate 100.0%")
        metrics = (await gateway.client.get("/metrics")).text
        assert 'gateway_canary_rollbacks_total{reason="error_rate"} 1.0' in metrics
        assert (
            'gateway_version_requests_total{model="text_regression",outcome="error",role="canary",version="2"} 5.0'
            in metrics
        )


async def test_the_policy_survives_a_restart(tmp_path: Path) -> None:
    triton = FakeTriton(versions={1, 2})
    path = tmp_path / "policy.json"
    async with unit_gateway(triton, policy_path=path) as gateway:
        h = admin(gateway)
        await gateway.client.post("/v1/admin/versions/2/load", headers=h)
        await gateway.client.post("/v1/admin/policy/shadow", json={"version": 2}, headers=h)
    async with unit_gateway(triton, policy_path=path) as restarted:
        policy = (await restarted.client.get("/v1/admin/policy", headers=admin(restarted))).json()
        assert (policy["policy"]["stable"], policy["policy"]["shadow"]) == (1, 2)
        answer = (await predict(restarted, restarted.infer_key)).json()
        assert answer["model_version"] == "1"  # the shadow's answer is never returned
        deadline = time.monotonic() + 5
        while (
            'gateway_shadow_requests_total{model="text_regression",outcome="ok"} 1.0'
            not in (await restarted.client.get("/metrics")).text
        ):
            assert time.monotonic() < deadline
            await _tick()
        # The shadow's scores differ by 1000 from the served ones: the drift says so.
        assert (
            'gateway_shadow_drift_sum{model="text_regression"} 1000.0'
            in (await restarted.client.get("/metrics")).text
        )


async def _tick() -> None:
    await asyncio.sleep(0.01)


def test_shadow_copies_a_sample_of_the_requests() -> None:
    policy = TrafficPolicy(revision=1, stable=1).changed(
        "test", "shadow", shadow=2, shadow_percent=20.0
    )
    draws = [i / 1000 for i in range(1000)]
    assert sum(1 for draw in draws if policy.shadow_copy(draw) == 2) == 200
    with pytest.raises(errors.InvalidRequest):
        policy.changed("test", "none", shadow_percent=0.0)
    assert policy.changed("test", "off", shadow=None).shadow_copy(0.0) is None
