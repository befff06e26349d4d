"""One peak memory: `diag check` / `diag compare`, the dashboard's headline and memory page, and
the memory rules all read `RunMetrics.memory_peak` (per rank, the step whose six categories sum
highest), so they give the same number on a run whose per-category maxima fall on different
steps, where the sum of the maxima is not a peak the run ever had."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dashboard.data import load_runs, memory_at_peak, peak_rank
from dashboard.pages import memory, overview
from diag import diagnose, format_metric, load_any
from diag.contract.schema import MEMORY_CATEGORIES
from diag.outputs.compare import peak_memory_bytes
from diag.rules.families.memory import peaks

MIB = 2**20
STATE = {"params": MIB, "grads": MIB, "optimizer": MIB}
ACTIVATIONS = {1: 8 * MIB}  # by step; 1 MiB on the others
COMM_BUFFERS = {2: 6 * MIB}  # by step; 0.5 MiB on the others
PEAK = 3 * MIB + 8 * MIB + MIB // 2  # step 1: 11.5 MiB
SUM_OF_MAXIMA = 3 * MIB + 8 * MIB + 6 * MIB  # 17 MiB, never held at once
BUDGET = 12 * MIB  # the peak is 96% of it (MEM001 medium); the sum of maxima would be 142% (high)


def _run(runs: Any) -> Path:
    """Two ranks, four steps; rank 1 holds half of rank 0's activations and buffers."""
    records = {}
    for rank in range(2):
        rows = []
        for step in range(4):
            t0 = 100.0 * step
            rows += [runs.span(step, "fwd", t0, t0 + 100), runs.step(step, t0, t0 + 100)]
            rows.append(runs.mem(
                step, **STATE, fragmentation=None, device_peak=None,
                activations=ACTIVATIONS.get(step, MIB) // (rank + 1),
                comm_buffers=COMM_BUFFERS.get(step, MIB // 2) // (rank + 1),
            ))  # fmt: skip
        records[rank] = rows
    hardware = {"device_memory_bytes": BUDGET}
    return runs.write(records, runs.manifest(2, run_id="peaks", hardware=hardware))


def test_gate_dashboard_and_rules_agree_on_the_peak(runs: Any) -> None:
    run_dir = _run(runs)
    metrics, report = diagnose(load_any(run_dir))
    row = next(m for m in report["memory"] if m["rank"] == 0)
    assert sum(row[c] or 0 for c in MEMORY_CATEGORIES) == SUM_OF_MAXIMA  # the maxima: 3 steps
    assert (row["peak_bytes"], row["peak_step"]) == (PEAK, 1)

    # the gate (`diag check` / `diag compare`)
    assert peak_memory_bytes(report) == PEAK

    # the rules
    assert max(p.total_bytes for p in peaks(metrics)) == PEAK
    (over,) = [f for f in report["findings"] if f["rule"] == "MEM001"]
    assert over["evidence"]["total_bytes"] == PEAK and over["evidence"]["step"] == 1
    assert over["severity"] == "medium"  # 96% of the budget, not the 142% of the maxima

    # the dashboard: the Overview headline and the Memory page's bars
    (loaded,) = load_runs([run_dir])
    assert loaded.peak_bytes == PEAK
    tiles = dict(overview.headline(loaded))
    expected = f"{format_metric('peak_bytes', PEAK)} / {format_metric('budget_bytes', BUDGET)}"
    assert tiles["memory peak vs budget"] == expected
    assert peak_rank(loaded.metrics.memory_peak) == 0
    at_peak = memory_at_peak(loaded.metrics.memory_peak, loaded.metrics.memory_steps)
    bars = memory.body(loaded, "none")[0].figure
    stacked = sum(trace.y[0] for trace in bars.data)  # rank 0's stacked categories, MiB
    assert stacked == pytest.approx(PEAK / MIB)
    assert at_peak.loc[at_peak["rank"] == 0, "peak_bytes"].item() == PEAK


def test_device_peak_is_the_measured_figure_where_the_device_records_one(runs: Any) -> None:
    """On CUDA the gate compares the allocator's peak (`device_peak`); the six-category peak
    stays in `peak_bytes`."""
    report = diagnose(load_any(_run(runs)))[1]
    measured = {**report, "memory": [{**m, "device_peak": 20 * MIB} for m in report["memory"]]}
    assert peak_memory_bytes(measured) == 20 * MIB
    assert peak_memory_bytes({**report, "memory": []}) is None
