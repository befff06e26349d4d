"""A growing run analysed incrementally (`diag.LiveRun`, for `diag watch` and `diag dashboard
--live`): each finished step's records are read once (diag/read/growing.py), turned into its rows
of the per-step tables and dropped; an analysis reads the kept tables, never the records again, so
taking in a step costs that step, not the run so far.

What is kept, per finished step (appended in step order, `GrowingTable`):
- the step, memory, experts and event records (a few rows a rank and step);
- its time breakdown per (rank, step) (`rank_steps`, `time_breakdown`) and its collectives summed
  per (rank, step, op, group, tag, group size) (`comm_totals`): what the metrics and the rules
  that need the whole run read (`RunData.rank_steps`, `comm_totals`), exactly as a large run's
  loader reduces every step (diag/metrics/file_reduction.py);
- the spans and collectives themselves of a window of steps only (`RunData.span_steps`): the
  run's first steps, as the loader keeps them (the replay, late arrival, COM003 and the Timeline
  read them), or with `window_steps` the last steps.

`run()` is the RunData a from-scratch load of the same steps gives when the run is large
(`load_run` with `reduce_rank_files`): the same tables, the same per-step tables, so the same
findings (tests/unit/test_live_incremental.py). With `window_steps` (`diag watch`) it holds only
the last `window_steps` finished steps, as `RunTail.window` did, and the rows of older steps are
dropped, so the memory stays that of the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from diag.contract import schema
from diag.metrics.comm_totals import comm_totals, empty_totals
from diag.metrics.common import WARMUP_MIN_STEPS
from diag.metrics.growing_table import GrowingTable
from diag.metrics.time_breakdown import time_breakdown
from diag.numeric.keys import KEYS
from diag.read import record_window
from diag.read.growing import RunTail
from diag.read.load import RunData, frame_of, rank_file_suffix

_KEPT = ("steps", "memory", "experts", "events", "rank_steps", "comm_totals")
"""The RunData tables kept for every finished step (the first four as the records are)."""


@dataclass
class LiveRun:
    """A run directory analysed while it grows: `update` takes in the steps every rank has
    finished since the last call; `run` is the RunData of every step taken in (or of the last
    `window_steps`), built from the kept per-step tables."""

    folder: Path
    window_steps: int | None = None
    """None: every finished step (the dashboard); N: the last N (`diag watch`)."""
    last: int | None = None
    """The last step taken in."""
    tail: RunTail = field(init=False)
    _tables: dict[str, GrowingTable] = field(init=False)
    _firsts: pd.DataFrame | None = field(init=False, default=None)
    """Each rank's breakdown of its first step (its warm-up once it has WARMUP_MIN_STEPS)."""
    _first_step: dict[int, int] = field(init=False, default_factory=dict)
    _step_count: dict[int, int] = field(init=False, default_factory=dict)
    _records: list[tuple[int, pd.DataFrame, pd.DataFrame]] = field(init=False, default_factory=list)
    """(last step, spans, comms) of the chunks whose records are kept (`span_steps`)."""
    _span_steps: int | None = field(init=False, default=None)
    _manifest: schema.Manifest | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.tail = RunTail(self.folder)
        self._tables = {name: GrowingTable() for name in _KEPT}

    def manifest(self) -> schema.Manifest | None:
        """The manifest as it is now; None while it is absent or being written."""
        return self.tail.manifest()

    def update(self, manifest: schema.Manifest) -> int | None:
        """Read what the rank files gained and take in the steps every rank finished since
        the last call: the last of them, or None when no step was finished."""
        self._manifest = manifest
        self.tail.poll(manifest)
        finished = self.tail.finished_step(manifest.world_size)
        if finished is None or (self.last is not None and finished <= self.last):
            return None
        self._add(self.tail.take(manifest, finished))
        self.last = finished
        if self.window_steps is not None:
            first = self._first_shown()
            for table in self._tables.values():
                table.drop_before(first)
        return finished

    def run(self) -> RunData:
        """The steps taken in (every one, or the last `window_steps`) as a RunData whose
        per-step tables are the kept ones."""
        assert self._manifest is not None, "update() first"
        first = self._first_shown()
        tables = {name: self._tables[name].frame(first) for name in _KEPT}
        steps = _or_empty(tables["steps"], schema.RecordKind.STEP.value)
        spans, comms = self._kept_records(first)
        return RunData(
            manifest=self._manifest,
            path=self.folder,
            steps=steps,
            spans=spans,
            comms=comms,
            memory=_or_empty(tables["memory"], schema.RecordKind.MEM.value),
            experts=_or_empty(tables["experts"], schema.RecordKind.EXPERTS.value),
            events=_or_empty(tables["events"], schema.RecordKind.EVENT.value),
            skipped=list(self.tail.skipped),
            rank_steps=self._rank_steps(tables["rank_steps"], first),
            comm_totals=tables["comm_totals"] if len(tables["comm_totals"]) else empty_totals(),
            starts_at_warmup=first == 0,
            rank_file_suffix=rank_file_suffix(self.tail.files()),
            span_steps=self._span_steps if self.window_steps is None else None,
        )

    def _first_shown(self) -> int:
        if self.window_steps is None or self.last is None:
            return 0
        return max(0, self.last - self.window_steps + 1)

    def _add(self, chunk: RunData) -> None:
        """Append the per-step tables of newly finished steps (`chunk`: their records)."""
        by_step = ["step", "rank"]
        windows = chunk.steps.sort_values(KEYS, kind="stable").reset_index(drop=True)
        breakdown = time_breakdown(chunk.spans, chunk.comms, windows)
        first_seen = ~windows["rank"].isin(list(self._first_step)) & ~windows["rank"].duplicated()
        for rank, step in zip(windows["rank"], windows["step"], strict=True):
            self._first_step.setdefault(int(rank), int(step))
            self._step_count[int(rank)] = self._step_count.get(int(rank), 0) + 1
        if first_seen.any():
            firsts = breakdown[first_seen.to_numpy()]
            self._firsts = firsts if self._firsts is None else pd.concat([self._firsts, firsts])
        rest = breakdown[~first_seen.to_numpy()]
        self._tables["rank_steps"].append(_by_step(rest, by_step))
        self._tables["comm_totals"].append(_by_step(comm_totals(chunk.comms), by_step))
        self._tables["steps"].append(_by_step(chunk.steps, by_step))
        for name in ("memory", "experts", "events"):
            self._tables[name].append(_by_step(getattr(chunk, name), by_step))
        self._keep_records(chunk)

    def _keep_records(self, chunk: RunData) -> None:
        """Keep the chunk's spans and collectives of the window's steps: below `span_steps`
        (set from the first chunk as the loader sets it) or, with `window_steps`, the last."""
        if self.window_steps is not None:
            last = int(chunk.steps["step"].max()) if len(chunk.steps) else self.last or 0
            self._records.append((last, chunk.spans, chunk.comms))
            first = max(0, last - self.window_steps + 1)
            self._records = [part for part in self._records if part[0] >= first]
            return
        if self._span_steps is None:
            self._span_steps = _window_steps(chunk)
        below = self._span_steps
        if len(chunk.steps) and int(chunk.steps["step"].min()) >= below:
            return
        self._records.append((
            int(chunk.steps["step"].max()) if len(chunk.steps) else 0,
            chunk.spans[chunk.spans["step"] < below] if len(chunk.spans) else chunk.spans,
            chunk.comms[chunk.comms["step"] < below] if len(chunk.comms) else chunk.comms,
        ))  # fmt: skip

    def _kept_records(self, first: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The kept spans and collectives of steps `first` on, each one table."""
        spans = [s[s["step"] >= first] for _, s, _ in self._records if len(s)]
        comms = [c[c["step"] >= first] for _, _, c in self._records if len(c)]
        return (_joined(spans, schema.RecordKind.SPAN.value),
                _joined(comms, schema.RecordKind.COMM.value))  # fmt: skip

    def _rank_steps(self, kept: pd.DataFrame, first: int) -> pd.DataFrame:
        """The breakdown of the analysed steps: the kept rows and each rank's first step,
        but where that step is its warm-up (the run's start shown, WARMUP_MIN_STEPS steps)."""
        firsts = self._firsts
        if firsts is None or firsts.empty:
            return kept
        if first == 0:
            counts = firsts["rank"].map(self._step_count)
            firsts = firsts[counts < WARMUP_MIN_STEPS]
        else:
            firsts = firsts[firsts["step"] >= first]
        if firsts.empty:
            return kept
        if kept.empty:
            return firsts.reset_index(drop=True)
        return pd.concat([firsts, kept], ignore_index=True)


def _by_step(frame: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """A chunk's rows in step order (what a GrowingTable appends)."""
    if frame.empty:
        return frame
    return frame.sort_values(order, kind="stable").reset_index(drop=True)


def _window_steps(chunk: RunData) -> int:
    """How many first steps keep their spans and collectives, as the loader decides for a
    large run (`record_window.window_steps`), from the first chunk's records per rank and step."""
    pairs = max(len(chunk.steps), 1)
    per_pair = max((len(chunk.spans) + len(chunk.comms)) / pairs, 1.0)
    fitting = int(record_window.WINDOW_RECORDS / (per_pair * chunk.manifest.world_size))
    low = min(record_window.SPAN_WINDOW_STEPS, record_window.MIN_WINDOW_STEPS)
    return max(low, min(record_window.SPAN_WINDOW_STEPS, fitting))


def _or_empty(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    """A kept table, or the loader's table of no rows of its kind while none was kept."""
    if len(frame.columns):
        return frame
    return _joined([], kind)


def _joined(frames: list[pd.DataFrame], kind: str) -> pd.DataFrame:
    """Tables of one kind as one, label columns categorical over all their labels."""
    frames = [frame for frame in frames if len(frame)]
    if not frames:
        return frame_of(kind, {})
    out = pd.concat(frames, ignore_index=True)
    for name in frames[0].columns:
        if all(isinstance(f[name].dtype, pd.CategoricalDtype) for f in frames):
            labels = pd.concat([f[name].astype(object) for f in frames], ignore_index=True)
            out[name] = labels.astype("category")  # the categories of every frame, used ones
    return out
