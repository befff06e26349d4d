"""The per-step tables the pages plot: the timeline's window, the communication share per step,
memory per rank and step, expert load per step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dashboard.data.runs import LoadedRun
from diag import RunData
from diag.contract import schema

NS_PER_MS = 1e6


def analysed_steps(loaded: LoadedRun) -> list[int]:
    steps = loaded.metrics.rank_steps["step"]
    return sorted(int(s) for s in steps.unique()) if not steps.empty else []


def timeline_steps(loaded: LoadedRun) -> list[int]:
    """The analysed steps whose spans the run holds: all of them, or those below
    `RunData.span_steps` for a run too large to keep every span."""
    limit = loaded.run.span_steps
    steps = analysed_steps(loaded)
    return steps if limit is None else [s for s in steps if s < limit]


@dataclass(frozen=True)
class Window:
    """The spans and collectives of some steps, start and duration in ms from the first span."""

    spans: pd.DataFrame
    comms: pd.DataFrame


def timeline_window(
    run: RunData, steps: Sequence[int], ranks: Sequence[int] | None = None
) -> Window:
    """The spans and collectives of `steps` (of `ranks` only, when given), on a clock that starts
    at the first span of those steps on any rank (so two groups' windows share it)."""
    spans = run.spans[run.spans["step"].isin(list(steps))]
    comms = run.comms[run.comms["step"].isin(list(steps))]
    origin_ns = int(spans["t0"].min()) if not spans.empty else 0
    if ranks is not None:
        spans = spans[spans["rank"].isin(list(ranks))]
        comms = comms[comms["rank"].isin(list(ranks))]
    return Window(_in_ms(spans, origin_ns), _in_ms(comms, origin_ns))


def _in_ms(records: pd.DataFrame, origin_ns: int) -> pd.DataFrame:
    return records.assign(
        start_ms=(records["t0"] - origin_ns) / NS_PER_MS,
        duration_ms=(records["t1"] - records["t0"]) / NS_PER_MS,
    ).sort_values(["rank", "t0"])


def comm_share_by_step(rank_steps: pd.DataFrame) -> pd.DataFrame:
    """Per step: the median and maximum over ranks of comm and exposed-comm share of the wall."""
    if rank_steps.empty:
        return pd.DataFrame(columns=["step", "comm_median", "comm_max", "exposed_median"])
    shares = rank_steps.assign(
        comm=rank_steps["comm_s"] / rank_steps["wall_s"],
        exposed=rank_steps["exposed_comm_s"] / rank_steps["wall_s"],
    )
    by_step = shares.groupby("step")
    return pd.DataFrame({
        "comm_median": by_step["comm"].median(),
        "comm_max": by_step["comm"].max(),
        "exposed_median": by_step["exposed"].median(),
    }).reset_index()  # fmt: skip


def memory_of_rank(memory_steps: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One rank's six categories per step (bytes), the last record of each step."""
    frame = memory_steps[memory_steps["rank"] == rank]
    columns = ["step", *schema.MEMORY_CATEGORIES]
    return frame[columns].groupby("step").last().reset_index()


def peak_rank(memory_peak: pd.DataFrame) -> int | None:
    """The rank with the highest peak (`RunMetrics.memory_peak`), the lowest on a tie; None
    when no rank measured a byte."""
    if memory_peak.empty or not (memory_peak["peak_bytes"] > 0).any():
        return None
    ordered = memory_peak.sort_values("rank", kind="stable").reset_index(drop=True)
    return int(ordered.loc[ordered["peak_bytes"].astype("float64").idxmax(), "rank"])


def memory_at_peak(memory_peak: pd.DataFrame, memory_steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the six categories of the record that holds its peak (`memory_peak`: rank,
    step, peak_bytes), so that a rank's stacked categories add up to its peak: rank, step,
    peak_bytes and the categories, by rank."""
    columns = ["rank", "step", "peak_bytes", *schema.MEMORY_CATEGORIES]
    if memory_peak.empty:
        return pd.DataFrame(columns=columns)
    cats = list(schema.MEMORY_CATEGORIES)
    records = memory_steps[["rank", "step", *cats]].merge(memory_peak, on=["rank", "step"])
    held = records[cats].astype("float64").fillna(0.0).sum(axis=1)
    records = records.loc[held.groupby([records["rank"], records["step"]]).idxmax()]
    return records[columns].sort_values("rank").reset_index(drop=True)


@dataclass(frozen=True)
class ExpertSteps:
    layer: int
    steps: list[int]
    tokens: np.ndarray  # (steps, experts): tokens routed to each expert, summed over ranks
    drop_rate: list[float | None]  # per step: dropped / routed


def expert_steps(experts: pd.DataFrame) -> list[ExpertSteps]:
    """Per MoE layer, the load of every expert at every step, and the drop rate per step."""
    layers: list[ExpertSteps] = []
    for layer, frame in experts.groupby("layer", sort=True):
        lengths = frame["tokens"].map(len).to_numpy()
        width = int(lengths.max(initial=0))
        if width == 0:
            continue
        steps = sorted(int(s) for s in frame["step"].unique())
        rows = pd.Index(steps).get_indexer(frame["step"])
        if (lengths == width).all():  # every record names every expert: one array at once
            loads = np.array([list(t) for t in frame["tokens"]], dtype=float)
        else:
            loads = np.zeros((len(frame), width))
            for i, load in enumerate(frame["tokens"]):
                loads[i, : len(load)] = load
        tokens = np.zeros((len(steps), width))
        np.add.at(tokens, rows, loads)
        drops = pd.to_numeric(frame["dropped"], errors="coerce").to_numpy(dtype=float)
        known = np.bincount(rows, weights=~np.isnan(drops), minlength=len(steps)) > 0
        dropped = np.bincount(rows, weights=np.nan_to_num(drops), minlength=len(steps))
        routed = tokens.sum(axis=1)
        rates = [
            float(d / r) if ok and r > 0 else None
            for d, r, ok in zip(dropped, routed, known, strict=True)
        ]
        layers.append(ExpertSteps(int(layer), steps, tokens, rates))
    return layers
