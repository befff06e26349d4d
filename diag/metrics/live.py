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
- the spans and collectives themselves (the replay, late arrival, COM003 and the Timeline read
  them): every one while the rank files are smaller than the loader's REDUCE_SPANS_FROM_BYTES,
  as `diag analyze` keeps them; past it, those of the run's first steps only
  (`RunData.span_steps`), as the loader keeps a large run's; with `window_steps`, the last steps'.

`run()` is the RunData a from-scratch load of the same steps gives (`load_run` with
`reduce_rank_files`; a small run's per-step tables are those its metrics compute): the same tables,
the same per-step tables, so the same findings (tests/unit/test_live_incremental.py). With
`window_steps` (`diag watch`) it holds only the last `window_steps` finished steps, as
`RunTail.window` did, and the rows of older steps are dropped, so the memory stays that of the
window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.metrics import epochs
from diag.metrics.comm_totals import comm_totals, empty_totals
from diag.metrics.common import WARMUP_MIN_STEPS
from diag.metrics.epochs import epoch_orders
from diag.metrics.growing_table import GrowingTable
from diag.metrics.time_breakdown import time_breakdown
from diag.numeric.keys import KEYS
from diag.read import load, record_window
from diag.read.growing import Activity, RunTail
from diag.read.load import RunData, frame_of, rank_file_suffix
from diag.whatif.chunks import MEMO_NAME, ReplayMemo

_KEPT = ("steps", "memory", "experts", "events", "rank_steps", "comm_totals")
"""The RunData tables kept for every finished step (the first four as the records are)."""
_RECORDS = ("spans", "comms")
"""The tables kept whole while the run is small, then for a window of steps."""
_ORDERS = "epoch_orders"
"""Each `epoch` event's order hash (diag/metrics/epochs.py), the hash as a code (`_digests`)."""


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
    _span_steps: int | None = field(init=False, default=None)
    """None while every span and collective is kept (a run as small as the loader keeps
    whole); then the first steps whose records are kept (`RunData.span_steps`)."""
    _manifest: schema.Manifest | None = field(init=False, default=None)
    _digests: dict[str, int] = field(init=False, default_factory=dict)
    """Each order hash seen (`_ORDERS`), by its code."""
    _memo: ReplayMemo = field(init=False, default_factory=ReplayMemo)
    """The attribution's chunks replayed so far: a finished chunk is not replayed again."""

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.tail = RunTail(self.folder)
        self._tables = {name: GrowingTable() for name in (*_KEPT, *_RECORDS, _ORDERS)}

    def manifest(self) -> schema.Manifest | None:
        """The manifest as it is now; None while it is absent or being written."""
        return self.tail.manifest()

    def update(self, manifest: schema.Manifest, now_s: float | None = None) -> int | None:
        """Read what the rank files gained and take in the steps every rank finished since
        the last call: the last of them, or None when no step was finished. `now_s` (the
        caller's clock) times each rank's activity (`liveness`)."""
        self._manifest = manifest
        self.tail.poll(manifest, now_s)
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
            file_mtimes_s=_mtimes(self.tail),
            span_steps=self._span_steps if self.window_steps is None else None,
        )

    def derived(self) -> dict[str, Any]:
        """What the rules derive from `run()`'s tables, kept as the steps came (by their names in
        `RuleContext.derived`, for `diagnose(..., derived=)`): the last order hash of each
        rank's epochs (PIT001), each step's events read once, not every event after each step."""
        orders = self._tables[_ORDERS].frame(self._first_shown())
        if not len(orders.columns):
            orders = epoch_orders(frame_of(schema.RecordKind.EVENT.value, {}))
        return {epochs.DERIVED_NAME: epochs.last_orders(orders), MEMO_NAME: self._memo}

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
        for name in ("memory", "experts"):
            self._tables[name].append(_by_step(getattr(chunk, name), by_step))
        events = _by_step(chunk.events, by_step)
        self._tables["events"].append(events)
        orders = epoch_orders(events)
        known = self._digests
        codes = [known.setdefault(digest, len(known)) for digest in orders["digest"]]
        self._tables[_ORDERS].append(orders.assign(digest=np.array(codes, dtype=np.int64)))
        self._keep_records(chunk)

    def _keep_records(self, chunk: RunData) -> None:
        """Keep the chunk's spans and collectives: every one while the rank files are
        smaller than the loader's REDUCE_SPANS_FROM_BYTES (as `diag analyze` keeps them), then
        those of the first steps only (`span_steps`, set as the loader sets it); with
        `window_steps`, those of the last steps (`update` drops the older)."""
        spans, comms = self._tables["spans"], self._tables["comms"]
        below = self._span_steps
        if below is None:
            spans.append(_by_step(chunk.spans, ["step", "rank"]))
            comms.append(_by_step(chunk.comms, ["step", "rank"]))
            if self.window_steps is None and self._reduced():
                records, pairs = len(spans) + len(comms), len(self._tables["steps"])
                self._span_steps = below = _window_steps(chunk.manifest, records, pairs)
                spans.keep_before(below)
                comms.keep_before(below)
            return
        if len(chunk.steps) and int(chunk.steps["step"].min()) < below:
            spans.append(_by_step(chunk.spans[chunk.spans["step"] < below], ["step", "rank"]))
            comms.append(_by_step(chunk.comms[chunk.comms["step"] < below], ["step", "rank"]))

    def _reduced(self) -> bool:
        """Whether the rank files are as large as the loader reduces (REDUCE_SPANS_FROM_BYTES)."""
        size = sum(path.stat().st_size for path in self.tail.files())
        return size >= load.REDUCE_SPANS_FROM_BYTES

    def _kept_records(self, first: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The kept spans and collectives of steps `first` on, each one table."""
        spans, comms = (self._tables[name].frame(first) for name in _RECORDS)
        return (_or_empty(spans, schema.RecordKind.SPAN.value),
                _or_empty(comms, schema.RecordKind.COMM.value))  # fmt: skip

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


WINDOW_STEPS = 3.0
"""A rank is silent after this many median steps without progress (plus WINDOW_FLOOR_S)."""
WINDOW_FLOOR_S = 5.0
SLACK_S = 1.0
"""A silent rank is named this much (and one poll) before the window ends: reading the files
and analysing them take time, and the name must come within the window."""
DEAD_HEARTBEATS = 2.0
"""With heartbeats, the job is dead when no rank wrote anything for the window plus this many
heartbeat periods (a live rank inside a step writes one every period)."""
DEAD_WINDOWS_WITHOUT_HEARTBEAT = 4.0
"""Without heartbeats (an older collector), this many windows of silence from every rank."""


@dataclass
class Liveness:
    """What the arriving records say of the job now (`liveness`): the ranks to name (silent,
    stalled, crashed; each once per episode is the caller's business), the collectives ranks
    wait in, and why the job is over with a failure (None while it is not)."""

    window_s: float
    silent: list[dict[str, Any]] = field(default_factory=list)
    waiting: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    dead: str | None = None


def liveness(
    activity: dict[int, Activity], world_size: int, now_s: float, poll_s: float = 0.0
) -> Liveness:
    """Name the ranks whose progress stopped for 3 median steps + 5 s while others' records
    or heartbeats go on (or whose stall event or exception arrived), unless they wait in a
    collective (then another rank holds them); say the job died when every rank closed with a
    failure or raised, or no rank wrote for long (docs/cli.md, "watch"). `poll_s`: how often
    the caller looks; a rank is named that much before the window ends, so that the name comes
    within it."""
    walls = [w for a in activity.values() for w in a.step_walls_ns if w > 0]
    median_s = float(np.median(walls)) / 1e9 if walls else 1.0
    found = Liveness(WINDOW_STEPS * median_s + WINDOW_FLOOR_S)
    for rank, act in activity.items():
        for key in act.open_comms:
            found.waiting.setdefault(key, []).append(rank)
    recent = {
        r for r, a in activity.items()
        if a.last_record_s is not None and now_s - a.last_record_s < found.window_s
    }  # fmt: skip
    for rank, act in sorted(activity.items()):
        if act.closed == "complete":
            continue
        where = _where(act)
        if act.exception is not None:
            exc = act.exception
            found.silent.append({"rank": rank, "reason": f"raised {exc.get('type')}: "
                                 f"{str(exc.get('message') or '')[:160]}", **where})  # fmt: skip
            continue
        if act.open_comms or act.closed is not None:
            continue  # waiting on another rank, or closed
        idle = now_s - act.last_progress_s if act.last_progress_s is not None else None
        others = recent - {rank}
        if act.stall is not None:
            found.silent.append({"rank": rank, "reason": "stall event", "for_s": idle, **where})
        elif (
            idle is not None and idle >= max(found.window_s - SLACK_S - poll_s, median_s) and others
        ):
            found.silent.append({"rank": rank, "reason": "no progress", "for_s": idle, **where})
    found.dead = _dead(activity, world_size, now_s, found.window_s)
    return found


def _where(act: Activity) -> dict[str, Any]:
    """A rank's step, open span and stack top, for the line that names it."""
    span = list(act.open_spans.values())[-1] if act.open_spans else None
    stack = (act.stall or {}).get("stack")
    top = stack[-1] if isinstance(stack, list) and stack and isinstance(stack[-1], dict) else None
    return {
        "step": span["step"] if span else act.last_step,
        "span": str(span.get("phase")) if span else None,
        "stack_top": f"{top.get('function')} ({top.get('file')}:{top.get('line')})"
        if top
        else None,
    }


def _dead(
    activity: dict[int, Activity], world_size: int, now_s: float, window_s: float
) -> str | None:
    """Why the job is over with a failure, or None."""
    if not activity:
        return None
    ranks = list(activity.values())
    failed = [r for r, a in activity.items() if a.closed == "failed" or a.exception]
    over = all(a.closed is not None or a.exception is not None for a in ranks)
    if over and len(activity) >= world_size and failed:
        return f"every rank closed; rank {failed[0]} with a failure"
    beats = [a.heartbeat_s for a in ranks if a.heartbeat_s]
    quiet_s = window_s + DEAD_HEARTBEATS * max(beats) if beats else (
        DEAD_WINDOWS_WITHOUT_HEARTBEAT * window_s)  # fmt: skip
    last = max((a.last_record_s for a in ranks if a.last_record_s is not None), default=None)
    if (
        last is not None
        and now_s - last >= quiet_s
        and not all(a.closed == "complete" for a in ranks)
    ):
        return f"no record from any rank for {now_s - last:.1f} s"
    return None


def _mtimes(tail: RunTail) -> dict[int, float]:
    """Each rank file's modification time: whether records still arrive (the status)."""
    found = {}
    for rank, path in tail.rank_files().items():
        try:
            found[rank] = path.stat().st_mtime
        except OSError:
            continue
    return found


def _by_step(frame: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """A chunk's rows in step order (what a GrowingTable appends)."""
    if frame.empty:
        return frame
    return frame.sort_values(order, kind="stable").reset_index(drop=True)


def _window_steps(manifest: schema.Manifest, records: int, pairs: int) -> int:
    """How many first steps keep their spans and collectives, as the loader decides for a
    large run (`record_window.window_steps`), from the spans and collectives kept (`records`)
    per (rank, step) with a step record (`pairs`)."""
    per_pair = max(records / max(pairs, 1), 1.0)
    fitting = int(record_window.WINDOW_RECORDS / (per_pair * manifest.world_size))
    low = min(record_window.SPAN_WINDOW_STEPS, record_window.MIN_WINDOW_STEPS)
    return max(low, min(record_window.SPAN_WINDOW_STEPS, fitting))


def _or_empty(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    """A kept table, or the loader's table of no rows of its kind while none was kept."""
    if len(frame.columns):
        return frame
    return frame_of(kind, {})
