"""What a report says first when the job did not finish: the `where_stopped` rows and the
`failure` section of the report dict, and the "where each rank stopped" table every rendering
shows before the performance tables (diag/metrics/failure.py derives them)."""

from __future__ import annotations

from typing import Any

from diag.metrics import RunMetrics
from diag.outputs.units import num

STOPPED_HEADER = ["rank", "state", "step", "span", "collective", "waited s", "stack top"]


def failure_fields(metrics: RunMetrics) -> dict[str, Any]:
    """The report's `where_stopped` (one row per rank) and `failure` (the stuck collectives,
    crashes, desyncs, lost ranks and the Flight Recorder's view) when the run did not complete
    nor is still running; nothing otherwise (a finished run's report is unchanged)."""
    state = metrics.failure
    if state is None or not state.failed:
        return {}
    found = state.to_dict()
    rows = found.pop("ranks")
    found.pop("status")
    found.pop("reason")
    return {"where_stopped": rows, "failure": found}


def stopped_rows(report: dict[str, Any]) -> list[list[str]]:
    """The "where each rank stopped" rows, values formatted (empty for a finished run)."""
    return [
        [str(w["rank"]), str(w["state"]), num(w.get("step")), str(w.get("span") or "-"),
         str(w.get("collective") or "-"), num(w.get("waited_s")), str(w.get("stack_top") or "-")]
        for w in report.get("where_stopped") or []
    ]  # fmt: skip


def stopped_title(report: dict[str, Any]) -> str:
    summary = report.get("summary") or {}
    return f"where each rank stopped (run {summary.get('status')}: {summary.get('status_reason')})"


def stuck_collectives(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The collectives ranks were left waiting in (for a timeline's marks): group, seq, op,
    step, the waiting and missing ranks, and each waiting rank's wait in s."""
    return list((report.get("failure") or {}).get("stuck") or [])
