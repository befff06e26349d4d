"""Run metrics from loaded tables: per-rank time breakdown, collectives, memory, expert load.

Pure: no file access. Every definition is in docs/metrics.md. Record times are int64 ns and stay
integers until they are turned into seconds at the end, so nanoseconds are never rounded away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from diag.metrics import pipeline
from diag.metrics.collectives import collectives, tp_vs_ledger
from diag.metrics.comm_totals import run_comm_totals
from diag.metrics.common import (
    KEYS,
    NS_PER_S,
    analysed_steps,
    in_steps,
    note_orphans,
    note_unrecorded_sync,
    rank_step_order,
)
from diag.metrics.device_time import device_time
from diag.metrics.experts import expert_load
from diag.metrics.failure import RunState, run_state
from diag.metrics.file_reduction import reduce_rank_files
from diag.metrics.host import descheduled_by_rank, host_steps, host_table
from diag.metrics.memory import MEMORY_FIELDS, memory_maxima, memory_peak
from diag.metrics.summary import summary as run_summary
from diag.metrics.time_breakdown import rank_table, time_breakdown
from diag.numeric.keys import whole_steps
from diag.read.load import RunData
from diag.whatif.attribution import Attribution, attribute, attribution_summary, with_waits
from diag.whatif.chunks import MEMO_NAME, ReplayMemo

__all__ = [
    "KEYS", "MEMORY_FIELDS", "MEMO_NAME", "NS_PER_S", "RunMetrics", "compute_metrics",
    "in_steps", "memory_peak", "reduce_rank_files", "run_comm_totals", "whole_steps",
]  # fmt: skip


@dataclass
class RunMetrics:
    """What `compute_metrics` derives from a run; the tables have one row per rank / group."""

    summary: dict[str, Any]
    ranks: pd.DataFrame
    """rank, host, steps, step_time_s, wall_s, busy_s, comm_s, exposed_comm_s, idle_s, fractions;
    stage and bubble_frac (null unless pp > 1, diag.metrics.pipeline)."""
    rank_steps: pd.DataFrame
    """One row per analysed (rank, step): wall_s, busy_s, comm_s, exposed_comm_s, idle_s and
    stage_work_s (compute, comm_wait spans and blocking collectives outside the pipeline group:
    the time not lost to the pipeline, the complement of its bubble)."""
    collectives: pd.DataFrame
    comm_totals: pd.DataFrame
    """The collectives summed per (rank, step, op, group, tag, group size), every step
    (`diag.metrics.comm_totals`; the loader's where a large run's workers summed them)."""
    memory: pd.DataFrame
    """Per rank, the maximum over steps of each memory field (bytes; null stays null)."""
    memory_steps: pd.DataFrame
    """Every mem record (rank, step, fields), for trends."""
    experts: pd.DataFrame
    memory_peak: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The one peak memory of diag: per rank, the step whose six categories sum highest
    (`rank, step, peak_bytes`, nulls counted as 0), used by the rules, `check` and the
    dashboard. Ranks without a mem record are absent."""
    device: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Profiler traces only: per rank, device time in HTA's terms (diag/read/kineto/device.py)."""
    host_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per analysed (rank, step): wall_s, cpu_s, proc_cpu_s, descheduled_s (waiting for a core),
    load1 (diag/metrics/host.py); empty where the run recorded none (trace folders, older runs)."""
    host: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per machine: ranks, usable_cores, oversubscribed, descheduled_share, cores_busy."""
    attribution: Attribution | None = None
    """Where the step goes: a replay of the measured run and its counterfactuals, the causes
    by the step time each costs (diag/whatif); None with fewer than two ranks."""
    skipped: list[str] = field(default_factory=list)
    failure: RunState | None = None
    """Whether the run finished and, when not, where each rank stopped (diag/metrics/failure.py)."""


def compute_metrics(
    run: RunData, replay_all: bool = False, memo: ReplayMemo | None = None
) -> RunMetrics:
    """Derive the metrics of a loaded run (see docs/metrics.md); `replay_all`: the attribution
    replays every analysed step (diag/whatif/chunks.py), not only a budget's; `memo`: the
    chunks a growing run replayed before (`LiveRun.derived()`)."""
    skipped: list[str] = []
    windows, warmup_steps = analysed_steps(run.steps, run.starts_at_warmup)
    note_orphans(run, skipped)
    note_unrecorded_sync(run, skipped)
    rank_steps = run.rank_steps
    if rank_steps is None:
        rank_steps = time_breakdown(run.spans, run.comms, windows)
    ranks = pipeline.with_stages(rank_table(rank_steps, run.manifest), run.spans, run.manifest)
    on_host = host_steps(windows)
    if not on_host.empty:
        ranks["descheduled_frac"] = ranks["rank"].map(descheduled_by_rank(on_host))
    attribution = attribute(run, windows, on_host, replay_all, memo)
    if attribution is not None:
        ranks = with_waits(ranks, attribution)
    summary = run_summary(run, windows, ranks, warmup_steps)
    summary["host_checked"] = not on_host.empty  # trace folders carry no CPU time (host.py)
    state = run_state(run)
    summary.update(status_summary(state))
    if state.failed and state.failed_step is not None:
        skipped.append(
            f"step {state.failed_step} did not finish on every rank: the figures above are of "
            "the steps before it; the failure finding reads its records"
        )
    if attribution is not None:
        summary.update(attribution_summary(attribution))
        skipped += attribution.notes
    totals = run_comm_totals(run)
    tp_rows = tp_vs_ledger(run, totals, windows)
    if tp_rows:
        summary["tp_vs_ledger"] = tp_rows
    memory_steps = run.memory.take(rank_step_order(run.memory)).reset_index(drop=True)
    return RunMetrics(
        summary=summary,
        ranks=ranks,
        rank_steps=rank_steps,
        collectives=collectives(totals, windows),
        comm_totals=totals,
        memory=memory_maxima(memory_steps),
        memory_steps=memory_steps,
        memory_peak=memory_peak(memory_steps),  # (the same rows in its order: no sort)
        experts=expert_load(run.experts, windows),
        device=device_time(run.device_time),
        host_steps=on_host,
        host=host_table(on_host, run.manifest),
        attribution=attribution,
        skipped=skipped,
        failure=state,
    )


def status_summary(state: RunState) -> dict[str, Any]:
    """The summary's status fields: `status`, `status_reason`, `failed_step`."""
    return {"status": state.status, "status_reason": state.reason,
            "failed_step": state.failed_step}  # fmt: skip
