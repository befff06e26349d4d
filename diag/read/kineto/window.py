"""A large trace folder reduced as a large run directory is (issue 43): every step's time
breakdown and collective totals (`RunData.rank_steps`, `comm_totals`), and the spans and
collectives themselves only for a window of first steps (`RunData.span_steps`).

The reduction is the run directories' (`metrics.file_reduction.reduce_rank_files`, from
packed columns, one trace at a time) and the window is theirs (`record_window`): the records
of the steps below the window's end, every comm_wait span, and the records of steps without
a step record. A trace is reduced once the layout is known, since its collectives' groups
are named by axis first (the breakdown tells pipeline waits from the others by that name).

Where the folder is read by local worker processes (`diag analyze` without a cluster), the
workers reduce the traces (`reduce_spilled`): each parsed trace's packed records wait on disk
(spill.py) while the gathering process infers the layout from what the workers counted, then
each worker reads, names, reduces and cuts one trace at a time and hands back its window and
its two tables, merged here as the one call over every trace would have made them
(`merged`). The gathering process then holds per trace its step records and its window,
never its spans and collectives. On a Dask cluster each trace's packed records stay with the
worker that parsed it (`distributed_scheduler.KeptOnCluster`) and that worker reduces it, the
same way. Elsewhere (a trace whose columns the spill does not take; an op whose naming reads
other traces' ops: batched kernels, unnamed groups under a given layout) the gathering process
reduces them (`reduce_traces`), one trace at a time, each trace's whole columns dropped as
soon as it is reduced; its loops are not compiled there (numba is not imported: about 100 MiB
in that process): the unions of a trace's intervals and the sums of its collectives run in
numpy, the same totals.

What is reduced, said in the report's notes (`note`): which steps keep their records.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diag.contract.schema import RecordKind
from diag.rankfile.records import Encoded, Packed, concat
from diag.read import record_window
from diag.read.kineto import spill
from diag.read.kineto.packed_comms import MESSAGE_COLUMNS, Message, PackedComms, named_by_axis
from diag.read.load import Breakdown, categorical
from diag.read.parallel import map_chunks, planned

if TYPE_CHECKING:
    from diag.read.distributed_scheduler import KeptOnCluster

STEP, SPAN, COMM = RecordKind.STEP.value, RecordKind.SPAN.value, RecordKind.COMM.value
NULL_SUFFIX = ":null"
"""A message column's null mask rides beside it through the window under this suffix."""


@dataclass
class Reduced:
    """What a large trace folder keeps: per trace the window's spans and collectives (with
    `peer` and `seq`), the reductions of every step, and the window's end."""

    spans: list[dict[str, Packed]]
    comms: list[PackedComms]
    rank_steps: pd.DataFrame
    comm_totals: pd.DataFrame
    keep_below: int


def window_end(steps: list[list[dict[str, Any]]], records: int, world_size: int) -> int:
    """The first step that keeps no records: the folder's first step plus `record_window`'s
    number of steps for this many records per rank and step (`records` over all traces)."""
    found = [s["step"] for part in steps for s in part]
    first = min(found, default=0)
    per_step = max(records / max(len(found), 1), 1.0) * max(world_size, len(steps))
    fitting = int(record_window.WINDOW_RECORDS / per_step)
    low, high = record_window.MIN_WINDOW_STEPS, record_window.SPAN_WINDOW_STEPS
    return int(first) + max(min(high, low), min(high, fitting))


def reduce_traces(
    breakdown: Breakdown,
    steps: list[list[dict[str, Any]]],
    spans: list[dict[str, Packed]],
    comms: list[PackedComms],
    comm_columns: list[dict[str, Packed]],
    keep_below: int,
) -> Reduced:
    """Each trace (its step records, packed spans, packed collectives and their columns with
    groups named by axis) reduced by `breakdown` (`load.Breakdown`: the metrics'
    `reduce_rank_files`, handed in, as the readers import no metric code), then cut to the
    window; the input lists are emptied as they are taken, so that one trace's whole columns
    are alive at a time."""
    kept_spans: list[dict[str, Packed]] = []
    kept_comms: list[PackedComms] = []

    def each_trace() -> Iterator[dict[str, dict[str, Packed]]]:
        for _ in range(len(steps)):
            columns = {
                STEP: _step_columns(steps.pop(0)),
                SPAN: spans.pop(0),
                COMM: {**comm_columns.pop(0), **_message_columns(comms[0])},
            }
            yield columns
            kept_spans.append(record_window.kept_records(columns, SPAN, keep_below))
            kept_comms.append(_kept_comms(comms.pop(0), columns, keep_below))

    reduced = breakdown(each_trace(), True)
    return Reduced(kept_spans, kept_comms, reduced["rank_steps"], reduced["comm_totals"],
                   keep_below)  # fmt: skip


@dataclass
class TraceReduced:
    """One trace reduced by a worker: its window's spans and collectives and its two tables."""

    spans: dict[str, Packed]
    comms: PackedComms
    rank_steps: pd.DataFrame
    comm_totals: pd.DataFrame


SPILLED_PARALLEL_FROM_BYTES = 8 * 2**20
"""Below this much spilled, the traces are reduced in the gathering process."""


def reduce_spilled(
    breakdown: Breakdown,
    paths: list[Any],
    axis_of: dict[tuple[int, ...], str],
    keep_below: int,
    workers: int | None = None,
    kept: KeptOnCluster | None = None,
) -> Reduced:
    """`reduce_traces` of traces spilled to `paths` (spill.py, in rank order; each file
    removed once read), by local worker processes a trace at a time; or, with `kept`, of
    traces kept on a Dask cluster (`paths`: (kept chunk, position in it) each), each by the
    worker that holds it. The same tables and windows."""
    if kept is not None:
        work = partial(_reduce_kept, breakdown=breakdown, axis_of=axis_of, keep_below=keep_below)
        _, done = planned(list(enumerate(paths)), 1, 1, "traces reduced", [0] * len(paths))
        parts = kept.apply(work, [(chunk, position) for chunk, position in paths], done)
    else:
        chunks = map_chunks(
            partial(_reduce_chunk, breakdown=breakdown, axis_of=axis_of, keep_below=keep_below),
            list(enumerate(paths)), count=workers, min_bytes=SPILLED_PARALLEL_FROM_BYTES,
            chunk_files=8, progress="traces reduced", cluster=False,
        )  # fmt: skip
        parts = [part for chunk in chunks for part in chunk]
    return Reduced(
        [p.spans for p in parts], [p.comms for p in parts],
        merged([p.rank_steps for p in parts], labels=()),
        merged([p.comm_totals for p in parts], labels=LABEL_KEYS), keep_below,
    )  # fmt: skip


def _reduce_chunk(
    chunk: list[tuple[int, Path]],
    breakdown: Breakdown,
    axis_of: dict[tuple[int, ...], str],
    keep_below: int,
) -> list[TraceReduced]:
    out = []
    for _, path in chunk:
        steps, spans, comms = spill.read(path)
        path.unlink(missing_ok=True)
        out.append(_reduced(dict(steps), spans, comms, breakdown, axis_of, keep_below))
    return out


def _reduce_kept(
    chunk: list[tuple[Any, Any, Any]],
    position: int,
    breakdown: Breakdown,
    axis_of: dict[tuple[int, ...], str],
    keep_below: int,
) -> TraceReduced:
    """(On the cluster's worker that keeps the parsed `chunk`) its trace at `position`
    reduced: (ParsedTrace, packed spans, PackedComms), as `kineto._parse_chunk` made it."""
    trace, spans, comms = chunk[position]
    steps = _step_columns(trace.records.get(STEP, []))
    return _reduced(steps, spans, comms, breakdown, axis_of, keep_below)


def _reduced(
    steps: dict[str, Packed],
    spans: dict[str, Packed],
    comms: PackedComms,
    breakdown: Breakdown,
    axis_of: dict[tuple[int, ...], str],
    keep_below: int,
) -> TraceReduced:
    """One trace's groups named by axis, its records reduced and cut to the window."""
    columns: dict[str, dict[str, Packed]] = {
        STEP: steps, SPAN: spans,
        COMM: {**named_by_axis(comms, axis_of), **_message_columns(comms)},
    }  # fmt: skip
    reduced = breakdown(iter([columns]), True)
    return TraceReduced(
        record_window.kept_records(columns, SPAN, keep_below),
        _kept_comms(comms, columns, keep_below), reduced["rank_steps"], reduced["comm_totals"],
    )  # fmt: skip


LABEL_KEYS = ("op", "group", "tag")
"""The label columns of `comm_totals` (categorical: `file_reduction._totals_frame`)."""


def merged(frames: list[pd.DataFrame], labels: tuple[str, ...]) -> pd.DataFrame:
    """Per-trace tables of the breakdown as its one call over the traces makes them: the rows
    of the non-empty ones in order (all empty: the first), each `labels` column categorical
    over the labels of all (sorted, `load.categorical`)."""
    kept = [frame for frame in frames if len(frame)]
    if len(kept) < 2:
        return (kept or frames)[0].reset_index(drop=True)
    out = pd.concat(kept, ignore_index=True)
    for name in labels:
        if name in out.columns:
            parts = [_encoded(frame[name]) for frame in kept]
            joined = concat(list(parts))
            assert isinstance(joined, Encoded)
            out[name] = categorical(joined)
    return out


def _encoded(column: pd.Series) -> Encoded:
    """A column (categorical or not) as labels and codes, null as None."""
    values = column.astype("category").cat
    codes = values.codes.to_numpy().astype(np.int64)
    labels = [*values.categories.tolist(), None]
    return Encoded(labels, np.where(codes < 0, len(labels) - 1, codes))


def _step_columns(rows: list[dict[str, Any]]) -> dict[str, Packed]:
    """What the reduction reads of a trace's step records, as int64 arrays."""
    return {
        name: np.array([row[name] for row in rows], dtype=np.int64)
        for name in ("rank", "step", "t0", "t1")
    }


def _message_columns(part: PackedComms) -> dict[str, Packed]:
    """`peer` and `seq` as columns that the window cuts with the others."""
    out: dict[str, Packed] = {}
    for name in MESSAGE_COLUMNS:
        found = part.messages[name]
        if isinstance(found, Message):
            out[name], out[name + NULL_SUFFIX] = found.values, found.null
        else:
            out[name] = found
    return out


def _kept_comms(
    part: PackedComms, columns: dict[str, dict[str, Packed]], keep_below: int
) -> PackedComms:
    """The trace's collectives in the window, as a PackedComms whose columns are the named
    ones (the layout's counts are no longer needed: emptied)."""
    kept = record_window.kept_records(columns, COMM, keep_below)
    messages: dict[str, Message | list[Any]] = {}
    for name in MESSAGE_COLUMNS:
        values = kept.pop(name)
        null = kept.pop(name + NULL_SUFFIX, None)
        messages[name] = (
            Message(np.asarray(values), np.asarray(null)) if null is not None else list(values)
        )
    rows = len(kept["step"])
    return PackedComms(kept, [None], np.zeros(rows, dtype=np.int32), messages)


def note(folder: Any, keep_below: int, first: int) -> str:
    """The report's note on what a large folder keeps."""
    return (
        f"{folder}: a large trace folder: every step's time breakdown and collective totals "
        f"kept, the spans and collectives themselves for steps {first}..{keep_below - 1} "
        "(and every comm_wait span); the replay, late arrival, COM003 and the Timeline read "
        "those steps"
    )
