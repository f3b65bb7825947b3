"""Results of a run: the JSON document, the markdown tables and a PNG to read at a glance."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from load.raw import RawResult, best
from load.stats import PhaseResult, _nan_to_none

STACK_VS_RAW_TARGET = 0.85
VS_BASELINE_THROUGHPUT_TARGET = 1.0
VS_BASELINE_P99_TARGET = 1.0
FIRST_REQUEST_TARGET = 1.5


@dataclass
class ColdStart:
    """Process start to ready, and the first request after ready against the steady p50."""

    ready_after_s: float | None
    first_request_ms: float
    first_request_error: str | None
    steady_p50_ms: float = math.nan

    @property
    def ratio(self) -> float:
        """First request latency / steady p50 (<= 1.5 shows the warm-up works)."""
        return _ratio(self.first_request_ms, self.steady_p50_ms)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return cast(
            dict[str, Any],
            _nan_to_none(
                {
                    "ready_after_s": self.ready_after_s,
                    "first_request_ms": self.first_request_ms,
                    "first_request_error": self.first_request_error,
                    "steady_p50_ms": self.steady_p50_ms,
                    "first_over_steady_p50": self.ratio,
                }
            ),
        )


@dataclass
class TargetReport:
    """Everything measured on one target."""

    name: str
    phases: list[PhaseResult] = field(default_factory=list)
    cold_start: ColdStart | None = None

    def phase(self, mode: str, concurrency: int | None = None) -> PhaseResult | None:
        """The first phase of ``mode`` (and ``concurrency`` for closed loop), if it was run."""
        for phase in self.phases:
            if phase.mode == mode and (concurrency is None or phase.concurrency == concurrency):
                return phase
        return None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "name": self.name,
            "cold_start": self.cold_start.to_json() if self.cold_start else None,
            "phases": [phase.to_json() for phase in self.phases],
        }


@dataclass(frozen=True)
class RatioRow:
    """One line of the comparison table."""

    comparison: str
    value: float
    target: str
    passed: bool | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return cast(
            dict[str, Any],
            _nan_to_none(
                {
                    "comparison": self.comparison,
                    "value": self.value,
                    "target": self.target,
                    "passed": self.passed,
                }
            ),
        )


def _ratio(numerator: float, denominator: float) -> float:
    if denominator == 0 or math.isnan(numerator) or math.isnan(denominator):
        return math.nan
    return numerator / denominator


def _row(
    comparison: str, value: float, *, at_least: float | None = None, at_most: float | None = None
) -> RatioRow:
    if math.isnan(value):
        return RatioRow(comparison, value, _target_text(at_least, at_most), None)
    if at_least is not None:
        return RatioRow(comparison, value, f">= {at_least:g}", value >= at_least)
    if at_most is not None:
        return RatioRow(comparison, value, f"<= {at_most:g}", value <= at_most)
    return RatioRow(comparison, value, "(report)", None)


def _target_text(at_least: float | None, at_most: float | None) -> str:
    if at_least is not None:
        return f">= {at_least:g}"
    if at_most is not None:
        return f"<= {at_most:g}"
    return "(report)"


def ratio_rows(
    targets: Sequence[TargetReport],
    raw: Sequence[RawResult],
    low_concurrency: int,
    high_concurrency: int,
) -> list[RatioRow]:
    """The ratios the project holds the stack to, from whatever targets were measured."""
    by_name = {target.name: target for target in targets}
    gateway, triton, baseline = (
        by_name.get("gateway"),
        by_name.get("triton"),
        by_name.get("baseline"),
    )
    stack = gateway or triton
    rows: list[RatioRow] = []

    def closed(target: TargetReport | None, concurrency: int) -> PhaseResult | None:
        return target.phase("closed", concurrency) if target else None

    gateway_low, triton_low = closed(gateway, low_concurrency), closed(triton, low_concurrency)
    if gateway_low and triton_low:
        value = _ratio(gateway_low.latency.p50_ms, triton_low.latency.p50_ms)
        rows.append(_row(f"gateway / triton p50 at concurrency {low_concurrency}", value))
    gateway_high, triton_high = closed(gateway, high_concurrency), closed(triton, high_concurrency)
    if gateway_high and triton_high:
        value = _ratio(gateway_high.texts_per_s, triton_high.texts_per_s)
        rows.append(_row(f"gateway / triton texts/s at concurrency {high_concurrency}", value))
    stack_high = closed(stack, high_concurrency)
    stack_name = stack.name if stack else "stack"
    if stack_high and raw:
        top = best(raw)
        value = _ratio(stack_high.texts_per_s, top.texts_per_s)
        rows.append(
            _row(
                f"{stack_name} texts/s at c{high_concurrency} / raw in-process best "
                f"(batch {top.batch_size})",
                value,
                at_least=STACK_VS_RAW_TARGET,
            )
        )
    baseline_high = closed(baseline, high_concurrency)
    if stack_high and baseline_high:
        rows.append(
            _row(
                f"{stack_name} / baseline texts/s at concurrency {high_concurrency}",
                _ratio(stack_high.texts_per_s, baseline_high.texts_per_s),
                at_least=VS_BASELINE_THROUGHPUT_TARGET,
            )
        )
        rows.append(
            _row(
                f"{stack_name} / baseline p99 at concurrency {high_concurrency}",
                _ratio(stack_high.latency.p99_ms, baseline_high.latency.p99_ms),
                at_most=VS_BASELINE_P99_TARGET,
            )
        )
    for target in targets:
        if target.cold_start is not None:
            rows.append(
                _row(
                    f"{target.name}: first request after ready / steady p50 (c{low_concurrency})",
                    target.cold_start.ratio,
                    at_most=FIRST_REQUEST_TARGET,
                )
            )
    return rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (cells as given: format numbers with :func:`fmt` first)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def met(passed: bool | None) -> str:
    """A target's verdict for a table: yes, **no**, or - when it could not be measured."""
    return {True: "yes", False: "**no**", None: "-"}[passed]


def fmt(value: float | None, digits: int = 1) -> str:
    """``value`` with ``digits`` decimals; n/a for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def ratio_table(rows: Sequence[RatioRow]) -> str:
    """Markdown table of the ratios."""
    lines = ["| comparison | measured | target | met |", "|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row.comparison} | {fmt(row.value, 2)}x | {row.target} | {met(row.passed)} |"
        )
    return "\n".join(lines)


def phase_table(targets: Sequence[TargetReport]) -> str:
    """Markdown table of every phase of every target."""
    lines = [
        "| target | phase | req/s | texts/s | p50 ms | p95 ms | p99 ms | max ms | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for target in targets:
        for phase in target.phases:
            errors = ", ".join(f"{kind}: {count}" for kind, count in phase.errors.items()) or "0"
            latency = phase.latency
            lines.append(
                f"| {target.name} | {phase.label} | {fmt(phase.requests_per_s)} | "
                f"{fmt(phase.texts_per_s)} | {fmt(latency.p50_ms)} | {fmt(latency.p95_ms)} | "
                f"{fmt(latency.p99_ms)} | {fmt(latency.max_ms)} | {errors} |"
            )
    return "\n".join(lines)


def cold_start_table(targets: Sequence[TargetReport]) -> str:
    """Markdown table of the cold starts that were measured."""
    lines = [
        "| target | start -> ready s | first request ms | steady p50 ms | ratio |",
        "|---|---|---|---|---|",
    ]
    for target in targets:
        cold = target.cold_start
        if cold is None:
            continue
        lines.append(
            f"| {target.name} | {fmt(cold.ready_after_s, 2)} | {fmt(cold.first_request_ms)} | "
            f"{fmt(cold.steady_p50_ms)} | {fmt(cold.ratio, 2)}x |"
        )
    return "\n".join(lines)


def raw_table(raw: Sequence[RawResult]) -> str:
    """Markdown table of the in-process benchmark."""
    lines = ["| batch size | texts/s | batch p50 ms |", "|---|---|---|"]
    for result in raw:
        lines.append(
            f"| {result.batch_size} | {fmt(result.texts_per_s)} | {fmt(result.batch_p50_ms)} |"
        )
    return "\n".join(lines)


def markdown(
    targets: Sequence[TargetReport], raw: Sequence[RawResult], rows: Sequence[RatioRow]
) -> str:
    """The whole report as markdown (ratios first: that is the table for docs/benchmarks.md)."""
    parts = []
    if rows:
        parts += ["### Ratios", ratio_table(rows)]
    if targets:
        parts += ["### Per target", phase_table(targets)]
    if any(target.cold_start for target in targets):
        parts += ["### Cold start", cold_start_table(targets)]
    if raw:
        parts += ["### Raw in-process pipeline (no server)", raw_table(raw)]
    return "\n\n".join(parts) + "\n"


def run_directory(results_dir: Path, kind: str) -> tuple[str, Path]:
    """A new run's time stamp and its folder, ``results_dir/<kind>-<stamp>``."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return stamp, results_dir / f"{kind}-{stamp}"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def config_json(config: Any) -> dict[str, Any]:
    """A run's configuration (a dataclass) ready for JSON: paths as text."""
    return {
        key: str(value) if isinstance(value, Path) else value
        for key, value in asdict(config).items()
    }


def save_run(run_dir: Path, document: dict[str, Any], text: str) -> dict[str, Any]:
    """Write ``document`` (results.json) and ``text`` (summary.md) into ``run_dir``; return the
    document with both the markdown and the folder added, as the command line prints them."""
    write_json(run_dir / "results.json", document)
    (run_dir / "summary.md").write_text(text)
    return {**document, "markdown": text, "run_dir": str(run_dir)}


def write_json(path: Path, document: dict[str, Any]) -> Path:
    """Write ``document`` as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_nan_to_none(document), indent=2) + "\n")
    return path


def plot(
    path: Path,
    targets: Sequence[TargetReport],
    raw: Sequence[RawResult],
    title: str,
) -> Path:
    """A PNG with, per target, the latency distribution, the throughput and the percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"gateway": "tab:blue", "triton": "tab:green", "baseline": "tab:red"}
    figure, (cdf_axis, throughput_axis, percentile_axis) = plt.subplots(
        1, 3, figsize=(18, 5.5), constrained_layout=True
    )
    figure.suptitle(title)

    # 1. Latency distribution: empirical CDF per target and phase.
    for target in targets:
        colour = colours.get(target.name)
        for phase, style in zip(target.phases, ("-", "--", ":", "-."), strict=False):
            values = sorted(phase.latencies_ms)
            if not values:
                continue
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            cdf_axis.step(
                values,
                fractions,
                style,
                color=colour,
                where="post",
                label=f"{target.name} {phase.label}",
            )
    cdf_axis.set_xscale("log")
    cdf_axis.set_xlabel("latency (ms, log scale)")
    cdf_axis.set_ylabel("fraction of requests at or below")
    cdf_axis.axhline(0.99, color="grey", linewidth=0.8)
    cdf_axis.text(cdf_axis.get_xlim()[0], 0.99, " p99", va="bottom", color="grey", fontsize=8)
    cdf_axis.set_title("Latency distribution")
    cdf_axis.grid(True, which="both", alpha=0.3)
    cdf_axis.legend(fontsize=8, loc="lower right")

    # 2. Throughput: texts/s of every phase, and the raw in-process figures for reference.
    labels: list[str] = []
    heights: list[float] = []
    bar_colours: list[str] = []
    for target in targets:
        for phase in target.phases:
            labels.append(f"{target.name}\n{phase.label}")
            heights.append(phase.texts_per_s)
            bar_colours.append(colours.get(target.name, "tab:purple"))
    for result in raw:
        labels.append(f"raw\nbatch {result.batch_size}")
        heights.append(result.texts_per_s)
        bar_colours.append("tab:grey")
    positions = range(len(labels))
    bars = throughput_axis.bar(positions, heights, color=bar_colours)
    throughput_axis.bar_label(bars, fmt="%.0f", fontsize=8)
    throughput_axis.set_xticks(list(positions), labels, fontsize=7, rotation=30, ha="right")
    if raw:
        top = best(raw)
        throughput_axis.axhline(
            top.texts_per_s * STACK_VS_RAW_TARGET,
            color="black",
            linestyle="--",
            linewidth=0.8,
            label=f"{STACK_VS_RAW_TARGET:g} x raw best",
        )
        throughput_axis.legend(fontsize=8)
    throughput_axis.set_ylabel("texts per second")
    throughput_axis.set_title("Throughput")

    # 3. p50 / p95 / p99 side by side per target and phase.
    phase_labels = [f"{t.name}\n{p.label}" for t in targets for p in t.phases]
    phases = [p for t in targets for p in t.phases]
    width = 0.27
    for offset, (name, attribute) in enumerate(
        (("p50", "p50_ms"), ("p95", "p95_ms"), ("p99", "p99_ms"))
    ):
        values = [getattr(p.latency, attribute) for p in phases]
        xs = [i + (offset - 1) * width for i in range(len(phases))]
        percentile_axis.bar(xs, values, width, label=name, alpha=0.55 + 0.15 * offset)
    percentile_axis.set_xticks(
        list(range(len(phases))), phase_labels, fontsize=7, rotation=30, ha="right"
    )
    percentile_axis.set_yscale("log")
    percentile_axis.set_ylabel("latency (ms, log scale)")
    percentile_axis.set_title("Latency percentiles")
    percentile_axis.legend(fontsize=8)
    percentile_axis.grid(True, axis="y", which="both", alpha=0.3)

    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
