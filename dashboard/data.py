"""The runs a dashboard serves, loaded once at start-up, and the per-step tables its pages plot.

The browser names a run by its position in the list the server was started with, never by a
path: no request reaches a file the user did not name on the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag import schema
from diag.analysis import diagnose, load_any
from diag.load import RunData
from diag.metrics import RunMetrics

NS_PER_MS = 1e6


@dataclass(frozen=True)
class LoadedRun:
    name: str  # unique label in the run selector
    run: RunData
    metrics: RunMetrics
    report: dict[str, Any]  # the diag.report/1 JSON contract

    @property
    def blamed_ranks(self) -> list[int]:
        """Ranks named by a high or medium finding, first finding first."""
        ranks: list[int] = []
        for finding in self.report["findings"]:
            if finding["severity"] in ("high", "medium"):
                ranks += [r for r in finding.get("ranks") or [] if r not in ranks]
        return ranks

    @property
    def budget_bytes(self) -> float | None:
        declared = self.run.manifest.hardware.device_memory_bytes
        return float(declared) if declared else None


def load_runs(
    paths: Sequence[str | Path], config: dict[str, Any] | None = None, hta: bool = False
) -> list[LoadedRun]:
    """Load, measure and diagnose every run (`hta`: with HTA's analyses of its traces);
    raises `diag.errors.InputError` on unusable input."""
    loaded: list[LoadedRun] = []
    taken: set[str] = set()
    for path in paths:
        run = load_any(path)
        metrics, report = diagnose(run, config, hta)
        name = _unique(run.manifest.run_id or Path(path).name, taken)
        loaded.append(LoadedRun(name, run, metrics, report))
    return loaded


def _unique(name: str, taken: set[str]) -> str:
    label, n = name, 2
    while label in taken:
        label, n = f"{name} ({n})", n + 1
    taken.add(label)
    return label


def pick(runs: Sequence[LoadedRun], index: Any) -> LoadedRun:
    """The run at `index` as the browser sent it; anything else (a string, out of range) is the
    first run."""
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(runs):
        return runs[index]
    return runs[0]


# --- Tables for the pages -----------------------------------------------------------------------


def analysed_steps(loaded: LoadedRun) -> list[int]:
    steps = loaded.metrics.rank_steps["step"]
    return sorted(int(s) for s in steps.unique()) if not steps.empty else []


@dataclass(frozen=True)
class Window:
    """The spans and collectives of some steps, start and duration in ms from the first span."""

    spans: pd.DataFrame
    comms: pd.DataFrame


def timeline_window(run: RunData, steps: Sequence[int]) -> Window:
    spans = run.spans[run.spans["step"].isin(list(steps))]
    comms = run.comms[run.comms["step"].isin(list(steps))]
    origin_ns = int(spans["t0"].min()) if not spans.empty else 0
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


def peak_rank(memory: pd.DataFrame) -> int | None:
    """The rank with the largest sum of measured categories."""
    if memory.empty:
        return None
    total = memory[list(schema.MEMORY_CATEGORIES)].sum(axis=1, min_count=1)
    return None if total.isna().all() else int(memory.loc[total.idxmax(), "rank"])


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
        width = max((len(t) for t in frame["tokens"]), default=0)
        if width == 0:
            continue
        steps = sorted(int(s) for s in frame["step"].unique())
        row_of = {step: i for i, step in enumerate(steps)}
        tokens = np.zeros((len(steps), width))
        dropped = np.zeros(len(steps))
        known = np.zeros(len(steps), dtype=bool)
        for step, load, drops in zip(frame["step"], frame["tokens"], frame["dropped"], strict=True):
            i = row_of[int(step)]
            tokens[i, : len(load)] += load
            if pd.notna(drops):
                dropped[i] += drops
                known[i] = True
        routed = tokens.sum(axis=1)
        rates = [
            float(d / r) if ok and r > 0 else None
            for d, r, ok in zip(dropped, routed, known, strict=True)
        ]
        layers.append(ExpertSteps(int(layer), steps, tokens, rates))
    return layers
