"""`diag compare`: runs side by side; a scaling sweep or a before/after pair read for its verdict.

- A **scaling sweep** (same model, every run a different world size): the throughput of each
  step up in ranks and its scaling efficiency, (tokens/s_B / tokens/s_A) / (world_B / world_A).
  Throughput that falls as GPUs are added is direct evidence of collapse pattern 1.
- A **before/after** set (same world size): each later run against the first, listing the
  metrics that got worse by more than the tolerance (relative).
`compare_reports` is pure (reports in, a JSON-safe dict out); the command renders it.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import click

from diag.analysis import analyze_path
from diag.check import (
    COMPARE_METRICS,
    DEFAULT_TOLERANCE,
    format_metric,
    metric_value,
    regressions,
)
from diag.errors import InputError
from diag.report_lines import PATTERN_NAMES
from diag.shell import fail
from diag.units import aligned, num, pct, si, size

COMPARE_SCHEMA = "diag.compare/1"
_DIMS = ("dp", "tp", "pp", "ep", "cp")


def layout_label(run: dict[str, Any]) -> str:
    """`dp=2 tp=2`, naming every dimension above 1 (`dp=1` for a single rank)."""
    layout = run.get("layout") or {}
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
    if falling:
        worst = min(falling, key=lambda s: s["speedup"])
        verdict = (
            f"pattern 1, {PATTERN_NAMES[1]}: throughput falls as GPUs are added "
            f"({worst['world_from']} -> {worst['world_to']} ranks: "
            f"{si(worst['tokens_per_s_from'])} -> {si(worst['tokens_per_s_to'])} tokens/s)"
        )
        return {"kind": "sweep", "sweep": steps, "pattern": 1, "verdict": verdict}
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
    return {"kind": "before_after", "regressions": found, "verdict": verdict}


# --- Rendering and the command ------------------------------------------------------------------


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
    return "\n".join(lines) + "\n"


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option(
    "--tolerance",
    type=float,
    default=DEFAULT_TOLERANCE,
    show_default=True,
    help="Relative change that counts as a regression in a before/after set.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def compare(paths: tuple[str, ...], tolerance: float, fmt: str) -> None:
    """Compare runs side by side: a scaling sweep (same model, different world sizes) or a
    before/after set (same world size; the first run is the baseline)."""
    if len(paths) < 2:
        raise click.UsageError("compare needs at least two runs")
    if tolerance < 0:
        raise click.UsageError(f"--tolerance must be >= 0, got {tolerance}")
    try:
        labelled = [(path, analyze_path(path)) for path in paths]
    except InputError as error:
        fail(error)
    result = compare_reports(labelled, tolerance)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2, allow_nan=False))
    else:
        click.echo(render_compare_text(result), nl=False)
