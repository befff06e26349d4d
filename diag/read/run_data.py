"""`RunData`, the loaded run's frozen tables, and `Breakdown`, the reduction a large run's
loader workers apply (diag/read/load.py fills both)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from diag.contract import schema
from diag.contract.schema import Manifest
from diag.rankfile.records import Packed


@dataclass(frozen=True)
class RunData:
    """A loaded run: the manifest, one table per record kind (one row per record), and notes.
    Frozen once loaded: what the metrics compute from it lives in `RunMetrics`, never on it."""

    manifest: Manifest
    path: Path
    steps: pd.DataFrame
    spans: pd.DataFrame
    comms: pd.DataFrame
    memory: pd.DataFrame
    experts: pd.DataFrame
    events: pd.DataFrame
    skipped: list[str] = field(default_factory=list)
    rank_steps: pd.DataFrame | None = None
    """The per-(rank, step) time breakdown (`diag.metrics`), computed while loading when the
    run was too large to keep every span; None otherwise (the metrics compute it)."""
    comm_totals: pd.DataFrame | None = None
    """The collectives summed per (rank, step, op, group, tag, group size)
    (`diag.metrics.comm_totals`), summed while loading when the run was too large to keep
    every collective; None otherwise (the metrics sum them)."""
    starts_at_warmup: bool = True
    """False when only a window of steps after the first was read (`steps`): its first step
    is an ordinary one, not the run's warm-up."""
    device_time: pd.DataFrame | None = None
    """Profiler traces only: per rank, device time measured from its kernels
    (diag/read/kineto/device.py: kernel_time_us, idle_us, compute_us, non_compute_us, comm_us,
    overlap); None for a run directory."""
    rank_file_suffix: str = schema.RANK_FILE_SUFFIX
    """How most of the run's rank files are named (`.arrows` or `.jsonl`), for notes."""
    cache_notes: list[str] = field(default_factory=list)
    """Why a cache entry beside the data was not used (reported with `skipped`, never stored
    in a cache: they describe this read, not the data)."""
    span_steps: int | None = None
    """When set, `spans` and `comms` hold every record only for steps below this (plus every
    comm_wait span and the records of steps without a step record): enough for timelines,
    stages, the replay and the rules that match records across ranks, at a memory that does
    not grow with the run's length; `rank_steps` and `comm_totals` cover every step. None:
    every record."""

    file_mtimes_s: dict[int, float] = field(default_factory=dict)
    """Each rank file's modification time (s, the wall clock) when it was read: whether
    records still arrive (`diag.metrics.failure`). Empty where there are no rank files."""
    flight_recorder: pd.DataFrame | None = None
    """PyTorch Flight Recorder entries (`diag.read.flight_recorder.FR_COLUMNS`), one row per
    entry of each rank's dump, read beside the run (RUN/flight-recorder/) or alone; None when
    there are none."""
    flight_recorder_ranks: list[int] = field(default_factory=list)
    """The ranks whose Flight Recorder dump was read (one with no entries included): a member
    of a group without one is unknown to the dumps, not behind (diag/metrics/failure_stuck.py)."""

    def rank_file_name(self, rank: int) -> str:
        """The file a rank's records come from, as notes name it."""
        return schema.rank_file_name(rank, self.rank_file_suffix)


Breakdown = Callable[[Iterable[dict[str, dict[str, Packed]]], bool], dict[str, pd.DataFrame]]
"""Per-(rank, step) reductions of some rank files' packed columns (one dict by kind a file,
taken one at a time, in order; the warm-up flag last) by the RunData field they fill: the
metrics' time breakdown (`rank_steps`) and collective totals (`comm_totals`), which a large
run's workers compute before keeping a window of spans and collectives. Called with an
empty list, it prepares what it needs (the loader does so before starting its workers,
which inherit it)."""
REDUCED_TABLES = ("rank_steps", "comm_totals")
