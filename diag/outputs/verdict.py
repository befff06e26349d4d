"""What the designed pages (the HTML report, the dashboard's Overview) lead with, read from the
report dict: the run's status and failure, each finding as a verdict (what is wrong, who, what it
costs, the fix, the catalogue after), the headline as labelled facts, the ranks a finding singles
out, and the what-if attribution said in words.

Plain data and strings only: the HTML report escapes them, the dashboard hands them to React.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diag.outputs.failure_report import STOPPED_HEADER, stopped_rows
from diag.outputs.report_lines import PATTERN_NAMES, cost_words, ms, range_reason
from diag.outputs.units import num, pct, rank_list, si

SEVERITY_WORDS = {"high": "HIGH", "medium": "MEDIUM", "low": "LOW"}
"""The severity as a card says it in text (the colour repeats it, never replaces it)."""
FAILED_STATUSES = frozenset({"failed", "hung"})
"""Run statuses that mean the job did not finish (shown as an alert above the verdict)."""


def analysed_ranks(report: dict[str, Any]) -> set[int]:
    """The ranks the report has a row for (every analysed rank)."""
    return {int(r["rank"]) for r in report.get("ranks") or [] if r.get("rank") is not None}


def singles_out(finding: dict[str, Any], ranks: set[int]) -> bool:
    """Whether `finding` points at some ranks rather than at the whole job: it names ranks, and
    not every analysed rank (a host finding naming ranks 0-3 of a 4-rank run is about the job;
    the same finding on 2 of 8 hosts singles those ranks out)."""
    named = {int(r) for r in finding.get("ranks") or []}
    return bool(named) and not (ranks and ranks <= named)


def singled_out_ranks(report: dict[str, Any]) -> list[int]:
    """The ranks the findings single out (`singles_out`), first finding first: the ranks the
    pages mark as blamed."""
    every = analysed_ranks(report)
    out: list[int] = []
    for finding in report.get("findings") or []:
        if singles_out(finding, every):
            out += [int(r) for r in finding["ranks"] if int(r) not in out]
    return out


@dataclass(frozen=True)
class Verdict:
    """One finding as a card says it."""

    severity: str  # high, medium, low (the CSS class)
    severity_text: str  # HIGH, MEDIUM, LOW
    what: str  # the finding's title
    who: str  # `rank 3`, `ranks 0-3 (every rank: the whole job)`, `the whole job (...)`
    singled_out: bool  # whether `who` singles ranks out (the blame mark)
    cost: str  # `costs 36% of the step (38.8 ms)`, or ""
    why: str  # how the cost follows from the excess, or ""
    fix: str  # the advice, or ""
    catalogue: str  # `BAL001 · pattern 3: speedup below theory` (the smaller line)


def verdicts(report: dict[str, Any]) -> list[Verdict]:
    every = analysed_ranks(report)
    return [verdict(finding, every) for finding in report.get("findings") or []]


def verdict(finding: dict[str, Any], ranks: set[int]) -> Verdict:
    severity = str(finding.get("severity") or "low")
    named = [int(r) for r in finding.get("ranks") or []]
    singled = singles_out(finding, ranks)
    who = "the whole job (no rank named)"
    if named:
        who = f"{'rank' if len(named) == 1 else 'ranks'} {rank_list(named)}"
        if not singled:
            who += " (every rank: the whole job)"
    cost = ""
    if finding.get("cost_s") is not None:
        cost = cost_words(finding)
    explained = (finding.get("evidence") or {}).get("cost_explained")
    if reason := range_reason(finding):  # the cost is a range: where the reading is unsure
        explained = f"{explained}; {reason}" if isinstance(explained, str) else reason
    pattern = finding.get("pattern")
    catalogue = str(finding.get("rule") or "")
    catalogue += (
        f" · pattern {pattern}: {PATTERN_NAMES.get(pattern, '?')}"
        if pattern is not None
        else " · configuration pitfall"
    )
    return Verdict(
        severity=severity if severity in SEVERITY_WORDS else "low",
        severity_text=SEVERITY_WORDS.get(severity, severity.upper() or "LOW"),
        what=str(finding.get("title") or ""),
        who=who,
        singled_out=singled,
        cost=cost,
        why=explained if isinstance(explained, str) else "",
        fix=str(finding.get("advice") or ""),
        catalogue=catalogue,
    )


def run_status(report: dict[str, Any]) -> str:
    """The run's status: the analysis's (`summary.status`, where the analysis decides it) or
    the manifest's (`run.status`); "unknown" without either."""
    status = (report.get("summary") or {}).get("status") or (report.get("run") or {}).get("status")
    return str(status) if status else "unknown"


def did_not_finish(report: dict[str, Any]) -> bool:
    return run_status(report) in FAILED_STATUSES


def status_words(report: dict[str, Any]) -> str:
    """`HUNG: rank 2 never joined all_reduce #41 of dp (step 6)`: the status and why."""
    reason = (report.get("summary") or {}).get("status_reason")
    return run_status(report).upper() + (f": {reason}" if reason else "")


def failure_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Where each rank stopped, as (header, rows of strings), from the report's `where_stopped`
    (diag/outputs/failure_report.py); empty when the run finished. The pages read it here."""
    rows = stopped_rows(report)
    return (list(STOPPED_HEADER), rows) if rows else ([], [])


RECORDERS = {
    "kineto": "PyTorch profiler traces",
    "custom": "diag's collectors in a training loop",
    "lightning": "diag's Lightning callback",
    "hf": "diag's Hugging Face Trainer callback",
}
"""What wrote a run, by the manifest's `trainer` (diag.contract.schema.TRAINERS)."""
REFERENCE_TRAINERS = frozenset({"dp", "tp", "pp", "ep", "zero3"})


def summary_items(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline as (label, value) facts: the ranks, the layout and where the run came from,
    the step in the user's terms, throughput, MFU, communication, the bubble, the status."""
    run, summary = report.get("run") or {}, report.get("summary") or {}
    world, analysed = run.get("world_size"), summary.get("ranks_analysed")
    ranks = f"{num(world)}" if analysed in (None, world) else f"{num(analysed)} of {num(world)}"
    layout = run.get("layout") or {}
    dims = [f"{d}={layout[d]}" for d in ("dp", "tp", "pp", "ep", "cp") if (layout.get(d) or 1) > 1]
    source = ", ".join(str(v) for v in (run.get("device_type"), run.get("backend")) if v)
    trainer = str(run.get("trainer") or "")
    recorder = RECORDERS.get(trainer) or trainer or "unknown"
    if trainer in REFERENCE_TRAINERS:
        recorder = f"the {trainer} reference trainer"
    tokens_per_s = summary.get("tokens_per_s")
    items = [
        ("ranks", f"{ranks} ({' '.join(dims) or 'dp=1'})"),
        ("recorded by", f"{recorder}{f' on {source}' if source else ''}"),
        ("mean step", _step(summary)),
        ("throughput", "n/a" if tokens_per_s is None else f"{si(tokens_per_s)} tokens/s"),
        ("MFU", _mfu(run, summary)),
        ("communication", f"{pct(summary.get('comm_share'))} of the step, "
                          f"{pct(summary.get('exposed_comm_share'))} exposed"),
    ]  # fmt: skip
    if summary.get("bubble_theory") is not None:
        items.append(("pipeline bubble", f"{pct(summary.get('bubble_fraction'))} "
                                         f"(theory {pct(summary['bubble_theory'])})"))  # fmt: skip
    items.append(("status", run_status(report)))
    return items


def _step(summary: dict[str, Any]) -> str:
    """`173.5 ms over steps 1-3 (3 steps)`."""
    step_s, count = summary.get("step_time_s"), summary.get("steps_analysed") or 0
    first, last = summary.get("first_step_analysed"), summary.get("last_step_analysed")
    span = "" if first is None or last is None else (
        f" over step {first}" if first == last else f" over steps {first}-{last}"
    )  # fmt: skip
    return f"{ms(step_s)}{span} ({count} step{'s' if count != 1 else ''})"


def _mfu(run: dict[str, Any], summary: dict[str, Any]) -> str:
    """`23% (225 TFLOP/s a GPU)`; the TFLOP/s alone on a device of unknown peak; `n/a` on a CPU
    run or when the model is unknown (as the text headline says it)."""
    tflops = summary.get("model_tflops_per_gpu")
    if summary.get("mfu") is not None:
        return f"{pct(summary['mfu'])} ({num(tflops)} TFLOP/s a GPU)"
    if tflops is not None and run.get("device_type") not in (None, "cpu"):
        return f"n/a (no peak known; {num(tflops)} TFLOP/s a GPU)"
    return "n/a (a CPU run)" if run.get("device_type") == "cpu" else "n/a"


SMALL_CAUSE_SHARE = 0.005
"""Causes below this share of the step are not drawn (dashboard.figures.step_waterfall)."""
OVERLAP_SAID_SHARE = 0.01
"""An overlap (or unexplained rest) below this share of the step is rounding, not said."""


def attribution_words(attribution: dict[str, Any] | None) -> str:
    """The what-if attribution in a sentence, so its chart needs no overlap bar: each cause is
    measured alone against the ideal step, and what the costs add up to beyond the measured step
    is the causes' overlap (or, short of it, the time no cause explains)."""
    if not attribution or not attribution.get("replayed_step_s"):
        return ""
    measured, ideal = attribution["replayed_step_s"], attribution["ideal_step_s"]
    causes = [c for c in attribution.get("causes") or [] if (c.get("cost_s") or 0) > 0]
    total = sum(c["cost_s"] for c in causes)
    gap = measured - ideal
    words = (
        f"The ideal step (every imbalance and transfer removed) is {ms(ideal)}; the measured step "
        f"is {ms(measured)}, {ms(gap)} more. Each cause is measured alone: what the step saves "
        "when only that cause is removed."
    )
    small = [c for c in causes if (c.get("cost_share") or 0) < SMALL_CAUSE_SHARE]
    if small:
        many = len(small) > 1
        words += (
            f" {len(small)} cause{'s' if many else ''} costing under "
            f"{100 * SMALL_CAUSE_SHARE:g}% of the step {'are' if many else 'is'} not drawn."
        )
    if abs(total - gap) < OVERLAP_SAID_SHARE * measured or not causes:
        return words
    if total > gap:
        return words + (
            f" Together the causes add to {ms(total)}, {ms(total - gap)} more than the gap: they "
            "overlap (removing one, another fills part of the time it frees), so their costs do "
            "not add up."
        )
    return words + f" {ms(gap - total)} of the gap is explained by no single cause."
