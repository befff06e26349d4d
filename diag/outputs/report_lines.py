"""The lines a report leads with, shared by every rendering and `diag watch`: the headline
(the run, its layout, which steps, the mean step, throughput, communication) and one line per
finding (what is wrong first, its ranks and cost, the rule and collapse pattern after)."""

from __future__ import annotations

from typing import Any

from diag.contract import schema
from diag.outputs.units import num, pct, pct_range, ranks_phrase, si


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


def _step(summary: dict[str, Any]) -> list[str]:
    """`step 0.245 s per rank (job-wide 0.276 s)  9.8k tokens/s`: the step each rank measures
    (its own start to end, what the user's timer shows) and the throughput of that step; the
    job-wide step (first rank's start to last rank's end) beside it where it differs."""
    rank_step, job_step = summary.get("rank_step_time_s"), summary.get("step_time_s")
    if rank_step is None:
        return [f"mean step {num(job_step)} s", f"{si(summary.get('tokens_per_s'))} tokens/s"]
    step = f"step {num(rank_step)} s per rank"
    if job_step is not None and num(job_step) != num(rank_step):
        step += f" (job-wide {num(job_step)} s)"
    return [step, f"{si(summary.get('tokens_per_s_rank_step'))} tokens/s"]


def _no_axis(run: dict[str, Any]) -> str:
    """A layout with no axis of several ranks: one rank, or ranks whose layout nobody gave
    (Flight Recorder dumps of groups other than the world)."""
    return "dp=1" if (run.get("world_size") or 1) <= 1 else "layout unknown"


def headline(report: dict[str, Any]) -> str:
    """`dp-demo  4 ranks (dp=4)  8 steps (1-8; warm-up step 0 excluded)  step 0.40 s per rank
    (job-wide 0.42 s)  10.2k tokens/s  comm 12% (exposed 9%)`."""
    run, summary = report["run"], report["summary"]
    layout = run.get("layout") or {}
    dims = [f"{d}={layout[d]}" for d in ("dp", "tp", "pp", "ep", "cp") if (layout.get(d) or 1) > 1]
    source = str(run.get("layout_source") or "")
    if source.startswith(schema.UNKNOWN_LAYOUT):  # its numbers stand for nothing: say why
        dims = [f"layout {source}"]
    parts = [
        run.get("run_id") or "(unnamed run)",
        _ranks(report, " ".join(dims) or _no_axis(run)),
        *_layout_source(run),
        _steps_analysed(summary),
        *_step(summary),
        *_model_flops(run, summary),
        f"comm {pct(summary.get('comm_share'))} (exposed {pct(summary.get('exposed_comm_share'))}"
        + (
            f", {pct(hidden)} of it hidden)"
            if (hidden := summary.get("hidden_comm_share"))
            else ")"
        ),
    ]
    if summary.get("bubble_fraction") is not None:
        bubble, theory = summary.get("bubble_fraction"), summary.get("bubble_theory")
        known = f" (theory {pct(theory)})" if theory is not None else " (theory: m unknown)"
        parts.append(f"bubble {pct(bubble)}{known}")
        if summary.get("stage_imbalance") is not None:
            parts.append(f"stage imbalance {num(summary['stage_imbalance'])}")
    status = summary.get("status")
    if status is not None:  # the status the data shows (diag/metrics/failure.py), first
        shown = parts if status == "completed" else [status_line(summary), *parts]
        return "  ".join(shown)
    if run.get("status") != schema.RunStatus.COMPLETE.value:
        parts.append(f"status {run.get('status')}")
    return "  ".join(parts)


def _ranks(report: dict[str, Any], layout: str) -> str:
    """`4 ranks (dp=4)`; `3 of 4 ranks (dp=4; rank 2 not analysed: see input)` when ranks of
    the world have no rows (their files are missing or unreadable: the input notes say why)."""
    world = report["run"].get("world_size")
    analysed = {row.get("rank") for row in report.get("ranks") or []}
    if not isinstance(world, int) or not analysed or len(analysed) >= world:
        return f"{world} rank{'' if world == 1 else 's'} ({layout})"
    missing = [rank for rank in range(world) if rank not in analysed]
    return (
        f"{len(analysed)} of {world} ranks ({layout}; {ranks_phrase(missing)} not analysed: "
        "see input)"
    )


def input_notes(report: dict[str, Any]) -> list[str]:
    """What of the input was not analysed and why (the report's `skipped`), said under the
    headline."""
    return [str(note) for note in report.get("skipped") or []]


def cache_notes(report: dict[str, Any]) -> list[str]:
    """The cache notes worth a reader's attention: why an entry could not be trusted or the
    cache was not used (a signature that does not verify, a linked cache folder); not an entry
    left stale by a change of the data or of diag, which was rebuilt as it should be."""
    return [str(note) for note in report.get("cache_notes") or [] if not _only_stale(str(note))]


def _only_stale(note: str) -> bool:
    parts = note.removesuffix(" - ignored, rebuilt").split("; ")
    return all(": stale (" in part for part in parts)


def status_line(summary: dict[str, Any]) -> str:
    """`HUNG: rank 2 never joined all_reduce #41 of dp (step 6)`: the status and its reason."""
    status, reason = str(summary.get("status") or ""), summary.get("status_reason")
    return f"{status.upper()}" + (f": {reason} --" if reason else " --")


def _layout_source(run: dict[str, Any]) -> list[str]:
    """`layout from the traces' process groups` (a trace folder's layout: never silently
    assumed; an unknown one is said with the ranks: `16 ranks (layout unknown: <why>)`);
    nothing for a run directory, whose manifest holds its layout."""
    source = run.get("layout_source")
    if not source or str(source).startswith(schema.UNKNOWN_LAYOUT):  # said with the ranks
        return []
    source, read = str(source), ""
    source, zero = _zero_read(source)
    if f"; {schema.SCHEDULE_READ}" in source:  # `m=8, v=2 (<evidence>)`: m and v, said
        source, read = source.split(f"; {schema.SCHEDULE_READ}", 1)
        read = ", " + read.split(" (", 1)[0] + " read from the sends per step"
    source = source.split(f"; {schema.SCHEDULE_UNKNOWN}", 1)[0]  # the bubble says m unknown
    shown = source.split(" (", 1)[0] if source.startswith("from") else source
    return [f"layout {shown}{read}{zero}"]


def _zero_read(source: str) -> tuple[str, str]:
    """The source without its ZeRO stage's part (diag/read/kineto/sharding.py), and that part
    as the headline says it: `, ZeRO-3 read from the collectives` where read, nothing where
    unknown (the report's null says it)."""
    head, sep, rest = source.partition("; ZeRO")
    if not sep:
        return source, ""
    zero, _, after = rest.partition("; ")
    head = head + (f"; {after}" if after else "")
    stage = zero.split(" ", 1)[0]  # `-3` of `-3 read: <evidence>`
    return head, (f", ZeRO{stage} read from the collectives" if " read: " in zero else "")


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
        head += f"  {cost_words(finding)}"
    pattern = finding.get("pattern")
    where = f", pattern {pattern}: {PATTERN_NAMES.get(pattern, '?')}" if pattern is not None else ""
    return f"{head}  [{finding.get('rule', '')}{where}]"


def cost_words(finding: dict[str, Any]) -> str:
    """`costs 36% of the step (38.8 ms)`; where the cost is a range (gaps whose reading is
    ambiguous), `costs 0.6-10.0 ms per step (3-59% of the step; the gaps before all_reduce
    (cp) may be waiting)`."""
    low_high = finding.get("cost_range_s")
    if not (isinstance(low_high, list) and len(low_high) == 2):
        return f"costs {pct(finding.get('cost_share'))} of the step ({ms(finding.get('cost_s'))})"
    low, high = (float(x) for x in low_high)
    evidence = finding.get("evidence") or {}
    in_shares = evidence.get("cost_range_share")
    shares = ""
    if isinstance(in_shares, list) and len(in_shares) == 2:
        shares = f"{pct_range(float(in_shares[0]), float(in_shares[1]))} of the step; "
    where = evidence.get("cost_range_where") or "some time in no record"
    return f"costs {low * 1e3:.1f}-{high * 1e3:.1f} ms per step ({shares}{where} may be waiting)"


def range_reason(finding: dict[str, Any]) -> str:
    """Why a finding's cost is a range (where the gaps whose reading is ambiguous are), or ""."""
    if finding.get("cost_range_s") is None:
        return ""
    reason = (finding.get("evidence") or {}).get("cost_range_reason")
    return reason if isinstance(reason, str) else ""


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"
