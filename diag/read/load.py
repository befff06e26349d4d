"""Turn a run directory into tidy tables: one pandas DataFrame per record kind, with a rank column.

What the run directory holds is found by run_files.py, each worker's share parsed by
rank_chunks.py, the tables built by record_tables.py, into `RunData` (run_data.py).

Bad input never raises a traceback: a run that cannot be analysed at all raises InputError (naming
the file and the reason); anything partial (a missing rank file, a line cut by a kill, a record
without a required field or with non-finite times) is skipped and noted in `RunData.skipped`.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import pandas as pd

from diag.errors import InputError
from diag.rankfile.rank_file import (  # noqa: F401 (the column names are the loader's contract too)
    COMM_COLUMNS,
    EVENT_COLUMNS,
    EXPERTS_COLUMNS,
    KEPT_COLUMNS,
    MEMORY_COLUMNS,
    NUMERIC_COLUMNS,
    SPAN_COLUMNS,
    STEP_COLUMNS,
    RankFile,
    as_columns,
    read_rank_file,
)
from diag.read import record_window
from diag.read.parallel import map_chunks, out_of_collection, total_bytes
from diag.read.rank_chunks import RankChunk, prepare_compiled, read_rank_chunk  # noqa: F401
from diag.read.record_tables import (  # noqa: F401 (re-exported: the loader's names)
    categorical,
    empty_run,
    frame_of,
    gather,
    numbers_of,
    numeric_column,
    run_from_columns,
    run_from_records,
)
from diag.read.run_data import REDUCED_TABLES, Breakdown, RunData
from diag.read.run_files import (  # noqa: F401 (re-exported: the loader's names)
    KINETO_PATTERNS,
    file_mtimes,
    load_manifest,
    rank_file_suffix,
    rank_files,
    rank_files_noted,
)

REDUCE_SPANS_FROM_BYTES = 128 * 2**20
"""Runs with more rank-file bytes than this keep spans only in a window (`RunData.span_steps`)."""
OPEN_END = 2**62
"""The end of a window of steps `A:` (every step from A on)."""


def load_run(
    path: str | Path, steps: range | None = None, breakdown: Breakdown | None = None
) -> RunData:
    """Load a run directory (manifest.json + rank-NNNNN.jsonl); raises InputError if unusable.
    `steps`: keep only the records of these steps (the others are dropped while parsing, so
    a long run's window costs the memory of the window). `breakdown`: on a large run, the
    workers reduce every span and collective with it into `RunData.rank_steps` and
    `comm_totals` and keep only a window of both; without it every record is kept.

    Rank files are parsed in parallel processes when the run is large (`parallel.py`)."""
    run_dir = Path(path)
    manifest = load_manifest(run_dir)
    skipped: list[str] = []
    try:
        rank_files = rank_files_noted(run_dir, manifest.world_size, skipped)
    except OSError as err:
        raise InputError(run_dir, f"cannot list the folder ({err.strerror or err})") from None
    files = list(rank_files.items())
    reduce = breakdown if total_bytes(files) >= REDUCE_SPANS_FROM_BYTES else None
    keep_below = None  # a large run's records are kept whole below this step
    if reduce is not None:
        first = steps.start if steps else 0
        keep_below = first + record_window.window_steps(files, manifest.world_size)
        prepare_compiled(reduce)  # here, before the workers fork: they inherit it loaded
    read = partial(read_rank_chunk, breakdown=reduce, window=steps, keep_below=keep_below)
    with out_of_collection():
        chunks = map_chunks(read, files, progress="rank files")
    parsed = [part for chunk in chunks for part in chunk.files]  # notes only: columns by chunk
    nan_loss = {
        file.name: part.nan_loss
        for file, part in zip(rank_files.values(), parsed, strict=True)
        if part.nan_loss
    }
    for part in parsed:
        skipped += part.skipped
    if nan_loss:
        names = ", ".join(sorted(nan_loss))
        skipped.append(f"{names}: loss is NaN in {sum(nan_loss.values())} step records (kept)")
    columns = {
        kind: {name: gather(kind, name, [chunk.columns[kind][name] for chunk in chunks])
               for name in names}
        for kind, names in KEPT_COLUMNS.items()
    }  # fmt: skip
    if steps is not None:
        shown = f"{steps.start}:" if steps.stop == OPEN_END else f"{steps.start}:{steps.stop}"
        skipped.append(f"{run_dir}: only steps {shown} read (--steps); the others not analysed")
    run = run_from_columns(manifest, run_dir, columns, skipped)
    if all(table.empty for table in (run.steps, run.spans, run.comms, run.memory, run.events)):
        # nothing usable at all (every file missing, garbage or refused); a run with records
        # but no finished step is analysed: a job that hung in its first step is a finding
        raise InputError(run_dir, _no_steps(steps, skipped))
    run = dataclasses.replace(
        run,
        rank_file_suffix=rank_file_suffix(list(rank_files.values())),
        starts_at_warmup=steps is None or steps.start == 0,
        file_mtimes_s=file_mtimes(rank_files),
    )
    if reduce is None:
        return run
    reduced = {name: _concat_reduced([c.reduced[name] for c in chunks]) for name in REDUCED_TABLES}
    return dataclasses.replace(
        run, rank_steps=reduced["rank_steps"], comm_totals=reduced["comm_totals"],
        span_steps=keep_below,
    )  # fmt: skip


def _no_steps(steps: range | None, skipped: list[str]) -> str:
    """Why a run directory has nothing to analyse: no step record was read, and the first
    notes that say what was wrong with its rank files."""
    window = "" if steps is None else " in the steps asked for (--steps)"
    notes = [note for note in skipped if "--steps" not in note]
    problems = notes[:NO_STEPS_NOTES]
    more = len(notes) - len(problems)
    said = "; ".join(problems) + (f"; {more} more notes" if more > 0 and problems else "")
    return f"no rank has a usable step record{window}" + (f" ({said})" if said else "")


NO_STEPS_NOTES = 3
"""Notes on the rank files quoted in the error of a run without a usable step."""


def with_cache_note(run: RunData, note: str | None) -> RunData:
    """The run with why a cache entry beside it was not used (`cache_notes`), when there is a
    reason; the run itself when not."""
    if not note or note in run.cache_notes:  # the tables' and the report's lookups say it once
        return run
    return dataclasses.replace(run, cache_notes=[*run.cache_notes, note])


def _concat_reduced(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The workers' reduced tables as one, label columns categorical again (chunks with
    different labels would otherwise concatenate to object columns)."""
    frame = pd.concat(parts, ignore_index=True)
    for name in frame.columns:
        if any(isinstance(part[name].dtype, pd.CategoricalDtype) for part in parts):
            frame[name] = frame[name].astype("category")
    return frame
