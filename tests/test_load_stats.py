"""Statistics of the load tool on samples whose answers are known."""

from __future__ import annotations

import math

import pytest

from load.stats import LatencySummary, Sample, percentile, rate, summarize
from load.workload import TextMix, make_requests, make_texts, word_counts


def test_nearest_rank_percentiles_of_one_to_a_hundred() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # unsorted on purpose
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1


def test_percentile_of_small_samples_is_an_observed_value() -> None:
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_rate_guards_zero_time() -> None:
    assert rate(50, 2.0) == 25.0
    assert rate(5, 0.0) == 0.0


def test_latency_summary_in_milliseconds() -> None:
    summary = LatencySummary.of([0.001 * v for v in range(1, 101)])
    assert summary.count == 100
    assert summary.p50_ms == pytest.approx(50)
    assert summary.p99_ms == pytest.approx(99)
    assert summary.max_ms == pytest.approx(100)
    assert summary.mean_ms == pytest.approx(50.5)


def test_summarize_excludes_warmup_counts_errors_and_rates() -> None:
    samples = [Sample(scheduled=0.5, latency=0.1, texts=2)]  # warm-up: before the window
    samples += [Sample(scheduled=1.0 + i * 0.1, latency=0.05, texts=2) for i in range(10)]
    samples += [
        Sample(scheduled=1.5, latency=0.0, texts=2, error="dropped"),
        Sample(scheduled=1.6, latency=0.2, texts=2, error="http_503"),
        Sample(scheduled=1.7, latency=0.0, texts=2, error="dropped"),
    ]
    result = summarize(samples, target="t", mode="open", window_start=1.0, offered_rate=10.0)
    # The window runs from 1.0 to the last completion: 1.9 + 0.05 = 1.95 s.
    assert result.elapsed_s == pytest.approx(0.95)
    assert result.requests == 13
    assert result.ok_requests == 10
    assert result.ok_texts == 20
    assert result.requests_per_s == pytest.approx(10 / 0.95)
    assert result.texts_per_s == pytest.approx(20 / 0.95)
    assert result.errors == {"dropped": 2, "http_503": 1}
    assert result.latency.p99_ms == pytest.approx(50)
    assert result.label == "open-10rps"
    assert result.to_json(include_latencies=False)["errors"] == {"dropped": 2, "http_503": 1}


def test_summary_of_nothing_is_json_safe() -> None:
    result = summarize([], target="t", mode="closed", window_start=0.0, concurrency=4)
    assert result.requests_per_s == 0.0
    assert result.to_json()["latency"]["p50_ms"] is None


def test_text_mix_is_deterministic_long_tailed_and_capped() -> None:
    mix = TextMix(median_words=20, sigma=0.9, max_words=200, seed=1)
    counts = word_counts(5000, mix)
    assert counts == word_counts(5000, mix)
    assert max(counts) <= 200 and min(counts) >= 1
    ordered = sorted(counts)
    assert 15 <= ordered[len(ordered) // 2] <= 25  # mostly short
    assert sum(count > 60 for count in counts) / len(counts) > 0.05  # some long
    texts = make_texts(50, mix)
    assert texts == make_texts(50, mix)
    assert [len(text.split()) for text in texts] == word_counts(50, mix)


def test_requests_have_the_asked_number_of_texts() -> None:
    requests = make_requests(7, 3, TextMix(seed=2))
    assert len(requests) == 7
    assert all(len(request) == 3 for request in requests)
