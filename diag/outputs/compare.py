"""Reports side by side: the metrics compared across runs and which way is worse (`regressions`,
which `diag check --baseline` gates on), and `compare_reports` (what `diag compare` and the
dashboard's Compare page show): a scaling sweep read for its efficiency, or a before/after set
read for what got worse. Pure: reports in, JSON-safe values out.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diag.outputs.escape import terminal_lines
from diag.outputs.report_lines import PATTERN_NAMES
from diag.outputs.units import aligned, format_metric, num, pct, si, size

DEFAULT_TOLERANCE = 0.1
"""Relative tolerance of a baseline comparison: slower by more than 10% is a regression."""


@dataclass(frozen=True)
class Metric:
    """A metric compared across runs: where it comes from and which way is worse."""

    name: str
    higher_is_worse: bool
    floor: float = 0.0  # relative changes are taken against max(before, floor)


BASELINE_METRICS = (Metric("step_time_s", True), Metric("tokens_per_s", False))
"""What `diag check --baseline` compares: the step time and the throughput."""


COMPARE_METRICS = (
    *BASELINE_METRICS,
    Metric("comm_share", True, floor=0.05),
    Metric("exposed_comm_share", True, floor=0.05),
    Metric("bubble_fraction", True, floor=0.05),
    Metric("peak_memory_bytes", True),
)
"""What `diag compare` lists for a before/after pair. Shares below 5% count as 5%, so that a
share moving from 1% to 2% is not called a 100% regression."""


@dataclass(frozen=True)
class Regression:
    metric: str
    before: float
    after: float
    change: float  # relative, signed: (after - before) / max(before, floor)
    tolerance: float

    def line(self, baseline_label: str = "baseline") -> str:
        return (
            f"regressed {self.metric}: {format_metric(self.metric, self.after)} "
            f"vs {baseline_label} {format_metric(self.metric, self.before)}"
            f" ({self.change:+.1%}, tolerance {self.tolerance:.0%})"
        )


def metric_value(report: Mapping[str, Any], name: str) -> float | None:
    """A summary field of the report, or `peak_memory_bytes` computed from its memory table."""
    if name == "peak_memory_bytes":
        return peak_memory_bytes(report)
    value = report["summary"].get(name)
    return None if value is None else float(value)


def peak_memory_bytes(report: Mapping[str, Any]) -> float | None:
    """The largest device peak over ranks, as the device measured it (`device_peak`, CUDA);
    without one, the largest `peak_bytes` (the six categories at a rank's peak step,
    `RunMetrics.memory_peak`: the peak the rules and the dashboard show)."""
    measured = [m["device_peak"] for m in report["memory"] if m.get("device_peak") is not None]
    if measured:
        return float(max(measured))
    peaks = [m["peak_bytes"] for m in report["memory"] if m.get("peak_bytes") is not None]
    return float(max(peaks)) if peaks and max(peaks) > 0 else None


def regressions(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    tolerance: float,
    metrics: tuple[Metric, ...] = BASELINE_METRICS,
) -> list[Regression]:
    """The metrics of `after` that are worse than `before` by more than `tolerance` (relative).
    A metric missing from either run is not compared."""
    found = []
    for metric in metrics:
        old, new = metric_value(before, metric.name), metric_value(after, metric.name)
        if old is None or new is None:
            continue
        scale = max(abs(old), metric.floor)
        if scale == 0:
            continue
        change = (new - old) / scale
        worse = change if metric.higher_is_worse else -change
        if worse > tolerance:
            found.append(Regression(metric.name, old, new, change, tolerance))
    return found


COMPARE_SCHEMA = "diag.compare/1"


_DIMS = ("dp", "tp", "pp", "ep", "cp")


def layout_label(run: dict[str, Any]) -> str:
    """`dp=2 tp=2`, naming every dimension above 1 (`dp=1` for a single rank)."""
    layout = run.get("layout") or {}
    if any(layout.get(d, 1) is None for d in _DIMS):  # the report could not read it
        return "layout unknown"
    return " ".join(f"{d}={layout[d]}" for d in _DIMS if (layout.get(d) or 1) > 1) or "dp=1"


def compare_reports(
    labelled: list[tuple[str, dict[str, Any]]], tolerance: float = DEFAULT_TOLERANCE
) -> dict[str, Any]:
    """Compare `(label, diag.report/1)` pairs; the result is JSON-safe (schema diag.compare/1)."""
    rows = [_row(label, report) for label, report in labelled]
    worlds = [row["world_size"] for row in rows]
    models = [report["run"].get("model") for _, report in labelled]
    result: dict[str, Any] = {
        "schema": COMPARE_SCHEMA,
        "runs": rows,
        "kind": "runs",
        "tolerance": tolerance,
        "sweep": [],
        "regressions": [],
        "pattern": None,
        "verdict": "",
    }
    if len(set(worlds)) == len(worlds) and all(m == models[0] for m in models):
        result.update(_sweep(rows))
        if not any((models[0] or {}).values()):  # no run describes its model: a sweep if one
            unnamed = "if these runs train one model (none names it): "
            result["verdict"] = unnamed + result["verdict"]
    elif len(set(worlds)) == 1:
        result.update(_before_after(labelled, tolerance))
    else:
        result["verdict"] = (
            "neither a scaling sweep (the models differ, or world sizes repeat) "
            "nor a before/after set (the world sizes differ)"
        )
    return result


def _row(label: str, report: dict[str, Any]) -> dict[str, Any]:
    run, summary = report["run"], report["summary"]
    return {
        "run": label,
        "run_id": run.get("run_id"),
        "world_size": run.get("world_size"),
        "layout": layout_label(run),
        "steps": summary.get("steps_analysed"),
        "step_time_s": summary.get("step_time_s"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "comm_share": summary.get("comm_share"),
        "exposed_comm_share": summary.get("exposed_comm_share"),
        "bubble_fraction": summary.get("bubble_fraction"),
        "peak_memory_bytes": metric_value(report, "peak_memory_bytes"),
        "high_findings": sum(f.get("severity") == "high" for f in report["findings"]),
        "first_finding": report["findings"][0]["rule"] if report["findings"] else None,
    }


def _sweep(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(rows, key=lambda row: row["world_size"])
    steps = []
    for a, b in itertools.pairwise(ordered):
        tps_a, tps_b = a["tokens_per_s"], b["tokens_per_s"]
        speedup = tps_b / tps_a if tps_a and tps_b is not None else None
        ranks_ratio = b["world_size"] / a["world_size"]
        steps.append({
            "from": a["run"], "to": b["run"],
            "world_from": a["world_size"], "world_to": b["world_size"],
            "tokens_per_s_from": tps_a, "tokens_per_s_to": tps_b,
            "speedup": speedup,
            "scaling_efficiency": speedup / ranks_ratio if speedup is not None else None,
            "throughput_falls": speedup is not None and speedup < 1,
        })  # fmt: skip
    falling = [s for s in steps if s["throughput_falls"]]
    unknown = [s for s in steps if s["speedup"] is None]
    if falling:
        worst = min(falling, key=lambda s: s["speedup"])
        verdict = (
            f"pattern 1, {PATTERN_NAMES[1]}: throughput falls as GPUs are added "
            f"({worst['world_from']} -> {worst['world_to']} ranks: "
            f"{si(worst['tokens_per_s_from'])} -> {si(worst['tokens_per_s_to'])} tokens/s)"
        )
        return {"kind": "sweep", "sweep": steps, "pattern": 1, "verdict": verdict}
    if unknown:  # a run without tokens/s (a profiler trace, a run without a batch size)
        shown = ", ".join(f"{s['world_from']} -> {s['world_to']}" for s in unknown)
        verdict = (
            f"throughput unknown at {shown} ranks (a run without tokens/s): whether it scales "
            "there cannot be said"
        )
        return {"kind": "sweep", "sweep": steps, "verdict": verdict}
    return {"kind": "sweep", "sweep": steps, "verdict": "throughput grows with every step up"}


def _before_after(labelled: list[tuple[str, dict[str, Any]]], tolerance: float) -> dict[str, Any]:
    (base_label, base), found = labelled[0], []
    for label, report in labelled[1:]:
        for reg in regressions(base, report, tolerance, COMPARE_METRICS):
            found.append(
                {"run": label, "baseline": base_label, "metric": reg.metric,
                 "before": reg.before, "after": reg.after, "change": reg.change}
            )  # fmt: skip
    verdict = (
        f"{len({r['run'] for r in found})} of {len(labelled) - 1} runs regressed against "
        f"{base_label} beyond {tolerance:.0%}"
        if found
        else f"no metric regressed against {base_label} beyond {tolerance:.0%}"
    )
    # a metric one run does not have was not compared: silence is not "no regression"
    unknown = [
        metric.name for metric in COMPARE_METRICS
        if any(metric_value(report, metric.name) is None for _, report in labelled)
    ]  # fmt: skip
    if len(unknown) == len(COMPARE_METRICS):
        verdict = "nothing compared: every metric is unknown in at least one run"
    elif unknown:
        verdict += f"; not compared (unknown in a run): {', '.join(unknown)}"
    return {"kind": "before_after", "regressions": found, "verdict": verdict,
            "not_compared": unknown}  # fmt: skip


def render_compare_text(result: dict[str, Any]) -> str:
    header = ["run", "world", "layout", "steps", "step s", "tokens/s", "comm", "exposed",
              "bubble", "peak mem", "high"]  # fmt: skip
    rows = [
        [r["run"], num(r["world_size"]), r["layout"], num(r["steps"]), num(r["step_time_s"]),
         si(r["tokens_per_s"]), pct(r["comm_share"]), pct(r["exposed_comm_share"]),
         pct(r["bubble_fraction"]), size(r["peak_memory_bytes"]), str(r["high_findings"])]
        for r in result["runs"]
    ]  # fmt: skip
    lines = [line[2:] for line in aligned([header, *rows])]
    if result["kind"] == "sweep":
        lines += ["", "scaling sweep (same model):"]
        for s in result["sweep"]:
            efficiency = s["scaling_efficiency"]
            lines.append(
                f"  {s['world_from']} -> {s['world_to']} ranks: tokens/s "
                f"{si(s['tokens_per_s_from'])} -> {si(s['tokens_per_s_to'])}, "
                f"scaling efficiency {pct(efficiency)}"
                + ("  (throughput falls)" if s["throughput_falls"] else "")
            )
    elif result["kind"] == "before_after":
        lines += ["", f"before/after (same world size, tolerance {result['tolerance']:.0%}):"]
        for reg in result["regressions"]:
            lines.append(
                f"  {reg['run']}: {reg['metric']} {format_metric(reg['metric'], reg['after'])} vs "
                f"{format_metric(reg['metric'], reg['before'])}"
                f" ({reg['change']:+.1%})"
            )
    lines += ["", result["verdict"]]
    return terminal_lines(lines) + "\n"  # run names are the input's
