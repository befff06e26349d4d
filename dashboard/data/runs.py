"""The runs a dashboard serves, loaded, measured and diagnosed once at start-up.

The browser names a run by its position in the list the server was started with, never by a
path: no request reaches a file the user did not name on the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from diag import RunData, RunMetrics, diagnose, load_any, singled_out_ranks


@dataclass(frozen=True)
class LoadedRun:
    name: str  # unique label in the run selector
    run: RunData
    metrics: RunMetrics
    report: dict[str, Any]  # the diag.report/1 JSON contract

    @property
    def blamed_ranks(self) -> list[int]:
        """The ranks a finding singles out (`diag.singled_out_ranks`), of any severity, first
        finding first (findings come ordered by severity, then cost): a rank named by a
        job-wide finding only (the host finding naming every rank) is not blamed. A low
        finding's ranks count too: severity grades what the finding costs the step, and the
        ranks it names are still the ones the diagnosis points at."""
        return singled_out_ranks(self.report)

    @property
    def peak_bytes(self) -> float | None:
        """The highest rank peak (`RunMetrics.memory_peak`); None without a measured byte."""
        peaks = self.metrics.memory_peak
        top = peaks["peak_bytes"].max() if not peaks.empty else None
        return float(top) if top is not None and pd.notna(top) and top > 0 else None

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
