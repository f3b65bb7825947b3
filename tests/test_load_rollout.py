"""The rollout benchmark's arithmetic, over a synthetic run: phases, the canary split, keys that
switched version, and the summary (the run itself needs minutes: docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

from load.rollout import Answer, OpenLoop, RolloutConfig, _results, phase_stats, rollout_markdown


def synthetic_loop() -> OpenLoop:
    loop = OpenLoop(
        "http://127.0.0.1:1", ["k"] * 10, [["text"]], RolloutConfig(repository=Path("unused"))
    )
    answers = []
    for i in range(1000):
        t = i * 0.1  # 100 s at 10 requests/s
        key = i % 10
        canary = 20 <= t < 60 and key == 3  # key 3 of 10 is on the canary: 10 %
        version = "2" if canary or t >= 60 else "1"
        status = 503 if i == 5 else 200
        answers.append(Answer(t, 0.010 + (0.1 if i % 100 == 0 else 0), status, version, key))
    loop.answers = answers
    return loop


def test_the_canary_split_and_stickiness_come_from_the_canary_phase() -> None:
    marks = {
        "baseline": 0.0, "build": 10.0, "load": 15.0, "canary": 20.0, "promote": 60.0,
        "unload": 61.0, "after": 62.0, "shadow": 70.0, "bad_canary": 80.0,
        "after_rollback": 90.0, "end": 100.0,
    }  # fmt: skip
    document = {
        "started": "test",
        "config": {"keys": 10, "canary_percent": 10.0, "bad_canary_percent": 10.0},
        **_results(
            RolloutConfig(repository=Path("unused")),
            synthetic_loop(),
            marks,
            capacity=20.0,
            rate=10.0,
            shadow_rounds=[{"off": phase_stats([]), "100%": phase_stats([])}],
            rollback_s=4.5,
            policy={"reason": "automatic rollback"},
        ),
    }
    split = document["canary_split"]
    assert split["requests"] == 390  # scheduled in [21, 60)
    assert split["share_percent"] == 10.0
    assert split["keys_seen"] == 10 and split["keys_seeing_both"] == 0
    assert document["phases"]["baseline"]["failed"] == 1
    assert document["phases"]["baseline"]["failures"] == {"503": 1}
    assert document["rollout"]["requests"] == 600  # build .. shadow: [10, 70)
    assert document["rollout"]["failed"] == 0
    text = rollout_markdown(document)
    assert "**10.00 %** to the canary" in text and "rolled back after **4.5 s**" in text
