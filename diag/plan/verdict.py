"""`diag check --plan`: a measured run held against the plan for its own layout.

Pure functions over a `diag.plan/1` document and a `diag.report/1` report. The run fails when
its step time is worse than the plan's by more than the tolerance; the line names the
dimension that misses most: measured minus planned seconds per step of compute, each
group's communication (the attribution's transfer costs, the waiting for peers excluded) and
the pipeline bubble.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

DEFAULT_PLAN_TOLERANCE = 0.25
_MATCH = ("dp", "tp", "pp", "cp", "ep", "zero", "microbatches", "v")


def run_layout(report: Mapping[str, Any]) -> dict[str, int]:
    """The report's layout in the plan's terms (ep counted inside dp)."""
    lay = report.get("run", {}).get("layout") or {}
    dp, ep = int(lay.get("dp") or 1), int(lay.get("ep") or 1)
    accumulation = int(lay.get("grad_accum") or 1)
    pp = int(lay.get("pp") or 1)
    m = int(lay.get("microbatches") or 1) * (accumulation if pp == 1 else 1)
    return {
        "dp": dp * ep,
        "tp": int(lay.get("tp") or 1),
        "pp": pp,
        "cp": int(lay.get("cp") or 1),
        "ep": ep,
        "zero": int(lay.get("zero_stage") or 0),
        "microbatches": m,
        "v": int(lay.get("virtual_stages") or 1),
    }


def planned_layout(plan: Mapping[str, Any], layout: Mapping[str, int]) -> dict[str, Any] | None:
    """The plan's entry for `layout` (recomputation aside), or None."""
    for entry in plan.get("layouts", []):
        if isinstance(entry, dict) and all(entry.get(k) == layout[k] for k in _MATCH):
            return entry
    return None


def measured_dimensions(report: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per step the run spent on each dimension the plan predicts."""
    ranks = report.get("ranks") or []
    busy = [r["busy_s"] / r["steps"] for r in ranks if r.get("steps")]
    step = float(report["summary"].get("step_time_s") or 0.0)
    out = {"compute": max(busy) if busy else 0.0}
    for cause in (report.get("attribution") or {}).get("causes", []):
        if cause.get("kind") == "transfer" and cause.get("group"):
            key = str(cause["group"])
            out[key] = out.get(key, 0.0) + float(cause.get("cost_s") or 0.0)
    bubble = report["summary"].get("bubble_fraction")
    if bubble is not None:
        out["pp"] = float(bubble) * step
    return out


def planned_dimensions(entry: Mapping[str, Any]) -> dict[str, float]:
    t = entry["time"]
    return {
        "compute": t["compute_s"] + t["optimizer_s"],
        "tp": t["tp_s"],
        "cp": t["cp_s"],
        "ep": t["ep_s"],
        "dp": t["dp_s"] + t["zero_s"],
        "pp": t["pp_bubble_s"] + t["pp_p2p_s"],
    }


def check_against_plan(
    report: Mapping[str, Any], plan: Mapping[str, Any], tolerance: float
) -> tuple[list[str], str | None]:
    """(violations, problem): one line when the run is slower than its plan by more than
    `tolerance`; `problem` says why the plan cannot be used (no entry for the layout)."""
    stated = report.get("run", {}).get("layout") or {}
    if any(stated.get(k, 1) is None for k in ("dp", "tp", "pp", "ep", "cp", "microbatches")):
        return [], "the run's layout is unknown (its report could not read it): give --layout"
    # a plan's entry is per ZeRO stage and micro-batches per step: never assumed 0 and 1
    if stated.get("zero_stage", 0) is None:
        return [], "the run's ZeRO stage is unknown (its report could not read it)"
    if (stated.get("pp") or 1) == 1 and stated.get("grad_accum", 1) is None:
        return [], "the run's gradient accumulation is unknown (its report could not read it)"
    layout = run_layout(report)
    entry = planned_layout(plan, layout)
    if entry is None:
        shown = ",".join(f"{k}={v}" for k, v in layout.items())
        return [], f"the plan has no layout {shown} (the run's)"
    planned_step = float(entry["step_time_s"])
    if not (math.isfinite(planned_step) and planned_step > 0):
        return [], f"the plan's step_time_s for the run's layout is {planned_step}"
    measured_step = float(report["summary"].get("step_time_s") or 0.0)
    if measured_step <= planned_step * (1 + tolerance):
        return [], None
    measured, planned = measured_dimensions(report), planned_dimensions(entry)
    keys = set(measured) | set(planned)
    worst = max(keys, key=lambda k: measured.get(k, 0.0) - planned.get(k, 0.0))
    line = (
        f"step_time_s {measured_step:.4g} s > plan {planned_step:.4g} s for {entry['layout']} "
        f"({measured_step / planned_step - 1:+.0%}, tolerance {tolerance:.0%}): {worst} misses "
        f"most: measured {measured.get(worst, 0.0):.4g} s vs plan {planned.get(worst, 0.0):.4g} s"
        " per step"
    )
    return [line], None
