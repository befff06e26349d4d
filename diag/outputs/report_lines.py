"""The lines a report leads with, shared by every rendering and `diag watch`: the headline
(the run, its layout, which steps, the mean step, throughput, communication) and one line per
finding (what is wrong first, its ranks and cost, the rule and collapse pattern after)."""

from __future__ import annotations

from typing import Any

from diag.contract import schema
from diag.outputs.units import num, pct, ranks_phrase, si


def _steps_analysed(summary: dict[str, Any]) -> str:
    """`8 steps (1-8; warm-up step 0 excluded)`: which steps the figures are of, and why one
    the run has is not among them (a profiler trace's window names its own steps)."""
    count = summary.get("steps_analysed", 0)
    first, last = summary.get("first_step_analysed"), summary.get("last_step_analysed")
    words = f"{count} step{'s' if count != 1 else ''}"
    if first is None or last is None:
        return words
    which = [str(first) if first == last else f"{first}-{last}"]
    warmup = summary.get("warmup_steps_excluded") or 0
    if warmup == 1 and first > 0:
        which.append(f"warm-up step {first - 1} excluded")
    elif warmup:
        which.append(f"{warmup} warm-up steps excluded")
    return f"{words} ({'; '.join(which)})"


def _no_axis(run: dict[str, Any]) -> str:
    """A layout with no axis of several ranks: one rank, or ranks whose layout nobody gave
    (Flight Recorder dumps of groups other than the world)."""
    return "dp=1" if (run.get("world_size") or 1) <= 1 else "layout unknown"


def headline(report: dict[str, Any]) -> str:
    """`dp-demo  4 ranks (dp=4)  8 steps (1-8; warm-up step 0 excluded)  mean step 0.42 s
    9.8k tokens/s  comm 12% (exposed 9%)`."""
    run, summary = report["run"], report["summary"]
    layout = run.get("layout") or {}
    dims = [f"{d}={layout[d]}" for d in ("dp", "tp", "pp", "ep", "cp") if (layout.get(d) or 1) > 1]
    parts = [
        run.get("run_id") or "(unnamed run)",
        f"{run.get('world_size')} ranks ({' '.join(dims) or _no_axis(run)})",
        _steps_analysed(summary),
        f"mean step {num(summary.get('step_time_s'))} s",
        f"{si(summary.get('tokens_per_s'))} tokens/s",
        *_model_flops(run, summary),
        f"comm {pct(summary.get('comm_share'))} (exposed {pct(summary.get('exposed_comm_share'))}"
        + (
            f", {pct(hidden)} of it hidden)"
            if (hidden := summary.get("hidden_comm_share"))
            else ")"
        ),
    ]
    if summary.get("bubble_theory") is not None:
        bubble, theory = summary.get("bubble_fraction"), summary["bubble_theory"]
        parts.append(f"bubble {pct(bubble)} (theory {pct(theory)})")
        if summary.get("stage_imbalance") is not None:
            parts.append(f"stage imbalance {num(summary['stage_imbalance'])}")
    status = summary.get("status")
    if status is not None:  # the status the data shows (diag/metrics/failure.py), first
        shown = parts if status == "completed" else [status_line(summary), *parts]
        return "  ".join(shown)
    if run.get("status") != schema.RunStatus.COMPLETE.value:
        parts.append(f"status {run.get('status')}")
    return "  ".join(parts)


def status_line(summary: dict[str, Any]) -> str:
    """`HUNG: rank 2 never joined all_reduce #41 of dp (step 6)`: the status and its reason."""
    status, reason = str(summary.get("status") or ""), summary.get("status_reason")
    return f"{status.upper()}" + (f": {reason} --" if reason else " --")


def _model_flops(run: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """`MFU 41% (405 TFLOP/s per GPU)`; the TFLOP/s alone on a device of unknown peak; nothing
    on a CPU run or when the model is unknown (the summary's `mfu_note` says why)."""
    tflops = summary.get("model_tflops_per_gpu")
    if summary.get("mfu") is not None:
        return [f"MFU {pct(summary['mfu'])} ({num(tflops)} TFLOP/s per GPU)"]
    if tflops is not None and run.get("device_type") not in (None, "cpu"):
        return [f"{num(tflops)} TFLOP/s per GPU"]
    return []


PATTERN_NAMES: dict[int | None, str] = {
    1: "more GPUs, slower",
    2: "throughput decays",
    3: "speedup below theory",
    4: "MoE quality risk",
    5: "OOM although the state fits",
    None: "pitfall",
}
"""Display names of the collapse patterns (docs/physics.md, "The five collapse patterns"); None is a
config pitfall."""
_SEVERITY_LABEL = {"high": "HIGH", "medium": "MED", "low": "LOW"}


def finding_head(finding: dict[str, Any]) -> str:
    """`HIGH  pipeline bubble 58% ...  ranks 0-3  costs 41% of the step (0.2 s)  [PIP002,
    pattern 3: speedup below theory]`: what is wrong first, the catalogue after."""
    severity = str(finding.get("severity") or "")
    label = _SEVERITY_LABEL.get(severity, severity.upper())
    head = f"{label:<4}  {finding.get('title', '')}".rstrip()
    ranks = finding.get("ranks") or []
    if ranks:
        head += f"  {ranks_phrase(ranks)}"
    if finding.get("cost_s") is not None:
        head += f"  costs {pct(finding.get('cost_share'))} of the step ({ms(finding['cost_s'])})"
    pattern = finding.get("pattern")
    where = f", pattern {pattern}: {PATTERN_NAMES.get(pattern, '?')}" if pattern is not None else ""
    return f"{head}  [{finding.get('rule', '')}{where}]"


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"
