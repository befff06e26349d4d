"""A few rank files parsed by one loader worker (diag/read/load.py hands them out): their
records as packed columns, and a large run's reductions of them, the spans and collectives
then cut to a window."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from diag.contract.schema import RecordKind
from diag.rankfile.rank_file import KEPT_COLUMNS, RankFile, read_rank_file
from diag.rankfile.records import Packed, concat
from diag.read import record_window
from diag.read.run_data import Breakdown


@dataclass
class RankChunk:
    """Consecutive rank files parsed by one worker: their notes (`files`, columns emptied),
    their records as one set of packed columns by kind, and their reductions (`Breakdown`)
    when the spans and collectives were reduced to a window (`read_rank_chunk`)."""

    files: list[RankFile]
    columns: dict[str, dict[str, Packed]]
    reduced: dict[str, pd.DataFrame] = field(default_factory=dict)


def prepare_compiled(breakdown: Breakdown) -> None:
    """Load a large run's compiled code in this process: the reader of Arrow rank files and
    the reduction's loops (`breakdown([], True)`). The loader calls it before its workers fork;
    a Dask worker, which inherits nothing, before its first chunk: without the loops there, a
    16,384-rank run's small files were reduced as Python, at 6x the local time."""
    from diag.rankfile import arrow_fast  # rank files only: not imported by a trace analysis

    arrow_fast.prepare()
    breakdown([], True)


def read_rank_chunk(
    files: list[tuple[int, Path]],
    breakdown: Breakdown | None = None,
    window: range | None = None,
    keep_below: int | None = None,
) -> RankChunk:
    """Parse a few rank files (only the records of the steps in `window` when given); with a
    `breakdown`, reduce their records with it from every span and collective, then keep
    only the spans and collectives of steps below `keep_below` (`RunData.span_steps`).

    The files are read one at a time as the breakdown takes them, and each is cut to what
    is kept before the next is read, so a worker holds one file's whole columns at a time
    (their buffers are then reused for the next file, instead of new memory faulted in)."""
    if breakdown is not None:  # a large run: a Dask worker loads the compiled code here
        prepare_compiled(breakdown)  # (in a local worker, inherited loaded, it costs nothing)
    parsed: list[RankFile] = []
    kept: list[dict[str, dict[str, Packed]]] = []
    below = keep_below or record_window.SPAN_WINDOW_STEPS
    windowed = (RecordKind.SPAN.value, RecordKind.COMM.value)

    def each_file() -> Iterator[dict[str, dict[str, Packed]]]:
        """Each file's columns, for the breakdown; once it has taken one, what is kept of it."""
        for rank, path in files:
            part = read_rank_file(rank, path)
            columns, part.columns = part.columns, {}
            parsed.append(part)
            if window is not None:
                columns = {k: record_window.in_window(t, window) for k, t in columns.items()}
            if breakdown is not None:
                yield columns
                columns = {
                    k: record_window.kept_records(columns, k, below) if k in windowed
                    else _owned(t)
                    for k, t in columns.items()
                }  # fmt: skip
            kept.append(columns)

    reduced: dict[str, pd.DataFrame] = {}
    if breakdown is None:
        list(each_file())  # yields nothing: reads every file whole
    else:
        reduced = breakdown(each_file(), window is None or window.start == 0)
    assert len(kept) == len(files), "the breakdown takes every file"
    columns = {
        kind: {name: concat([c[kind][name] for c in kept]) for name in names}
        for kind, names in KEPT_COLUMNS.items()
    }
    return RankChunk(parsed, columns, reduced)


def _owned(table: dict[str, Packed]) -> dict[str, Packed]:
    """A file's packed columns without views of its whole buffers (a kind packed straight
    from them is), so that those are freed as soon as the file is done."""
    return {name: v.copy() if isinstance(v, np.ndarray) and v.base is not None else v
            for name, v in table.items()}  # fmt: skip
