"""Turn a run directory into tidy tables: one pandas DataFrame per record kind, with a rank column.

Bad input never raises a traceback: a run that cannot be analysed at all raises InputError (naming
the file and the reason); anything partial (a missing rank file, a line cut by a kill, a record
without a required field or with non-finite times) is skipped and noted in `RunData.skipped`.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.contract.limits import (
    MAX_INDEX,
    MISSING_RANKS_LISTED,
)
from diag.contract.schema import Manifest, RecordKind
from diag.errors import InputError
from diag.rankfile import arrow_fast
from diag.rankfile.arrow_format import SUFFIX
from diag.rankfile.arrow_format import rank_file_name as arrow_rank_file_name
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
from diag.rankfile.record_checks import finite
from diag.rankfile.records import (
    Column,
    Encoded,
    Packed,
    concat,
    label_array,
    unpack,
)
from diag.read import record_window
from diag.read.parallel import map_chunks, total_bytes

_CATEGORIES: dict[str, tuple[str, ...]] = {RecordKind.COMM.value: ("op", "group", "tag", "dtype")}
"""Labels repeated on millions of records: categorical (one small code a row)."""

_LAYOUT_INTS = ("dp", "tp", "pp", "ep", "cp", "microbatches", "virtual_stages", "grad_accum")
KINETO_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz")
REDUCE_SPANS_FROM_BYTES = 128 * 2**20
"""Runs with more rank-file bytes than this keep spans only in a window (`RunData.span_steps`)."""
OPEN_END = 2**62
"""The end of a window of steps `A:` (every step from A on)."""


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
    manifest = _load_manifest(run_dir)
    skipped: list[str] = []
    try:
        rank_files = _rank_files(run_dir, manifest.world_size, skipped)
    except OSError as err:
        raise InputError(run_dir, f"cannot list the folder ({err.strerror or err})") from None
    files = list(rank_files.items())
    reduce = breakdown if total_bytes(files) >= REDUCE_SPANS_FROM_BYTES else None
    keep_below = None  # a large run's records are kept whole below this step
    if reduce is not None:
        first = steps.start if steps else 0
        keep_below = first + record_window.window_steps(files, manifest.world_size)
        _prepare_compiled(reduce)  # here, before the workers fork: they inherit it loaded
    read = partial(read_rank_chunk, breakdown=reduce, window=steps, keep_below=keep_below)
    with _out_of_collection():
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
        kind: {name: _gather(kind, name, [chunk.columns[kind][name] for chunk in chunks])
               for name in names}
        for kind, names in KEPT_COLUMNS.items()
    }  # fmt: skip
    if steps is not None:
        shown = f"{steps.start}:" if steps.stop == OPEN_END else f"{steps.start}:{steps.stop}"
        skipped.append(f"{run_dir}: only steps {shown} read (--steps); the others not analysed")
    run = _run_from_columns(manifest, run_dir, columns, skipped)
    if all(table.empty for table in (run.steps, run.spans, run.comms, run.memory, run.events)):
        # nothing usable at all (every file missing, garbage or refused); a run with records
        # but no finished step is analysed: a job that hung in its first step is a finding
        raise InputError(run_dir, _no_steps(steps, skipped))
    run = dataclasses.replace(
        run,
        rank_file_suffix=rank_file_suffix(list(rank_files.values())),
        starts_at_warmup=steps is None or steps.start == 0,
        file_mtimes_s=_mtimes(rank_files),
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


def _mtimes(rank_files: dict[int, Path]) -> dict[int, float]:
    """Each rank file's modification time (whether records still arrive: the run's status)."""
    found = {}
    for rank, path in rank_files.items():
        try:
            found[rank] = path.stat().st_mtime
        except OSError:
            continue
    return found


def with_cache_note(run: RunData, note: str | None) -> RunData:
    """The run with why a cache entry beside it was not used (`cache_notes`), when there is a
    reason; the run itself when not."""
    if not note or note in run.cache_notes:  # the tables' and the report's lookups say it once
        return run
    return dataclasses.replace(run, cache_notes=[*run.cache_notes, note])


@contextmanager
def _out_of_collection() -> Iterator[None]:
    """Every object alive now out of the cycle collector's reach while the rank files are
    parsed (`gc.freeze`, as Python's documentation advises before a fork): the forked workers'
    full collections no longer walk the modules and tables they inherit (about 0.3 s each on
    a large run), nor does this process's collection as their results arrive. Given back to
    the collector afterwards, so that a long-running process frees them when they go."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_from_records(
    manifest: Manifest,
    path: Path,
    records: dict[str, list[dict[str, Any]]],
    skipped: list[str],
    packed: dict[str, list[dict[str, Packed]]] | None = None,
) -> RunData:
    """A RunData from record dicts by kind (the rank files' records, or a trace's converted).
    `packed`: kinds given instead as packed columns, one part per file in order (a worker
    packs what it parsed: a fraction of the dicts' memory in the process that gathers)."""
    columns = as_columns(records)
    for kind, parts in (packed or {}).items():
        columns[kind] = {
            name: _gather(kind, name, [part.get(name, []) for part in parts])
            for name in KEPT_COLUMNS[kind]
        }
    return _run_from_columns(manifest, path, columns, skipped)


def _run_from_columns(
    manifest: Manifest, path: Path, columns: dict[str, dict[str, Column]], skipped: list[str]
) -> RunData:
    tables = {kind: _frame(kind, columns[kind]) for kind in KEPT_COLUMNS}
    tables["step"] = _drop_duplicate_steps(tables["step"], skipped)
    return RunData(
        manifest=manifest,
        path=path,
        steps=tables[RecordKind.STEP.value],
        spans=tables[RecordKind.SPAN.value],
        comms=tables[RecordKind.COMM.value],
        memory=tables[RecordKind.MEM.value],
        experts=tables[RecordKind.EXPERTS.value],
        events=tables[RecordKind.EVENT.value],
        skipped=skipped,
    )


def empty_run(manifest: Manifest, path: Path, skipped: list[str]) -> RunData:
    """A run of no records (what a Flight Recorder folder alone holds of the tables)."""
    return _run_from_columns(
        manifest, path, {kind: {n: [] for n in names} for kind, names in KEPT_COLUMNS.items()},
        skipped,
    )  # fmt: skip


def _load_manifest(run_dir: Path) -> Manifest:
    if not run_dir.exists():
        raise InputError(run_dir, "no such file or directory")
    if not run_dir.is_dir():
        raise InputError(run_dir, "is a file, not a run directory (a folder with manifest.json)")
    manifest_path = run_dir / schema.MANIFEST_FILE
    if not manifest_path.exists():
        if any(any(run_dir.glob(pattern)) for pattern in KINETO_PATTERNS):
            raise InputError(
                run_dir,
                "has files named like profiler traces (*.pt.trace.json[.gz]) but no "
                "manifest.json: a run directory needs one, and a trace folder is read as one "
                "when its files hold traceEvents",
            )
        below = _runs_below(run_dir)
        if below:
            shown = ", ".join(f"{name}/" for name in below[:4]) + (" ..." if len(below) > 4 else "")
            raise InputError(
                run_dir,
                f"holds no run itself but {len(below)} below it ({shown}): name one, or "
                f"compare them with `diag compare`",
            )
        raise InputError(
            run_dir, "has neither manifest.json nor Kineto traces (*.pt.trace.json[.gz])"
        )
    try:
        manifest = schema.read_manifest(run_dir)
    except schema.SchemaError as err:
        raise InputError(manifest_path, str(err)) from None
    except UnicodeDecodeError:
        raise InputError(manifest_path, "not valid JSON (not UTF-8 text)") from None
    except OSError as err:
        raise InputError(manifest_path, f"cannot read ({err.strerror or err})") from None
    for name in _LAYOUT_INTS:
        value = getattr(manifest.layout, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INDEX
        ):
            raise InputError(
                manifest_path,
                f"layout.{name} is {schema.shown(value)}, expected an integer in 1..{MAX_INDEX:,}",
            )
    return manifest


_MAX_LISTED_BELOW = 1000  # entries looked at one level down, so a huge folder costs no more


def _runs_below(folder: Path) -> list[str]:
    """Names of the folders directly below `folder` that hold a run (a manifest) or profiler
    traces: what a user who named their parent (a before/after pair, a sweep) meant."""
    from diag.read.kineto.files import is_trace_dir  # it reads RunData from here: imported late

    try:
        entries = sorted(itertools.islice(folder.iterdir(), _MAX_LISTED_BELOW))
    except OSError:
        return []
    found = []
    for entry in entries:
        try:
            if entry.is_dir() and ((entry / schema.MANIFEST_FILE).exists() or is_trace_dir(entry)):
                found.append(entry.name)
        except (OSError, InputError):
            continue  # unreadable: not a run anyone can name
    return found


def rank_files(run_dir: Path, world_size: int) -> dict[int, Path]:
    """The rank file of each rank of a run directory, as the loader picks them (its notes
    dropped: a reader after the load, which noted them)."""
    return _rank_files(run_dir, world_size, [])


def _rank_files(run_dir: Path, world_size: int, skipped: list[str]) -> dict[int, Path]:
    """The rank file of each rank found (the canonical name when two name one rank); notes
    for files outside the world, second files of a rank and missing ranks."""
    found: dict[int, Path] = {}
    for file in sorted(run_dir.iterdir(), key=lambda f: (f.name != _canonical(f.name), f.name)):
        match = schema.RANK_FILE_RE.match(file.name)
        if not match:
            continue
        rank = int(match.group(1))
        if rank >= world_size:
            skipped.append(
                f"{file.name}: rank {rank} is outside the world of {world_size}, ignored"
            )
        elif rank in found:
            skipped.append(f"{file.name}: a second file of rank {rank} (after "
                           f"{found[rank].name}), ignored")  # fmt: skip
        else:
            found[rank] = file
    if not found:
        raise InputError(
            run_dir,
            f"no rank files (rank-NNNNN.arrows or rank-NNNNN.jsonl) for ranks "
            f"0..{world_size - 1} of the world",
        )
    missing = [r for r in range(world_size) if r not in found]
    suffix = rank_file_suffix(list(found.values()))
    if len(missing) <= MISSING_RANKS_LISTED:
        for rank in missing:
            name = schema.rank_file_name(rank, suffix)
            skipped.append(f"{name}: missing (rank {rank} of {world_size} not analysed)")
    else:
        names = ", ".join(schema.rank_file_name(r, suffix) for r in missing[:3])
        skipped.append(f"{names} and {len(missing) - 3} more: missing ({len(missing)} of "
                       f"{world_size} ranks not analysed)")  # fmt: skip
    return found


def rank_file_suffix(files: list[Path]) -> str:
    """The suffix most of a run's rank files have (a missing rank's file would have it)."""
    arrows = sum(file.name.endswith(SUFFIX) for file in files)
    return SUFFIX if 2 * arrows > len(files) else schema.RANK_FILE_SUFFIX


def _canonical(name: str) -> str:
    """The name the writer gives the rank a file name holds (rank-00001.jsonl for
    rank-000001.jsonl, rank-00001.arrows for rank-000001.arrows); the name itself when it
    holds none."""
    match = schema.RANK_FILE_RE.match(name)
    if not match:
        return name
    rank = int(match.group(1))
    return arrow_rank_file_name(rank) if name.endswith(SUFFIX) else schema.rank_file_name(rank)


@dataclass
class RankChunk:
    """Consecutive rank files parsed by one worker: their notes (`files`, columns emptied),
    their records as one set of packed columns by kind, and their reductions (`Breakdown`)
    when the spans and collectives were reduced to a window (`read_rank_chunk`)."""

    files: list[RankFile]
    columns: dict[str, dict[str, Packed]]
    reduced: dict[str, pd.DataFrame] = field(default_factory=dict)


def _prepare_compiled(breakdown: Breakdown) -> None:
    """Load a large run's compiled code in this process: the reader of Arrow rank files and
    the reduction's loops (`breakdown([], True)`). The loader calls it before its workers fork;
    a Dask worker, which inherits nothing, before its first chunk: without the loops there, a
    16,384-rank run's small files were reduced as Python, at 6x the local time."""
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
        _prepare_compiled(breakdown)  # (in a local worker, inherited loaded, it costs nothing)
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


def _concat_reduced(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The workers' reduced tables as one, label columns categorical again (chunks with
    different labels would otherwise concatenate to object columns)."""
    frame = pd.concat(parts, ignore_index=True)
    for name in frame.columns:
        if any(isinstance(part[name].dtype, pd.CategoricalDtype) for part in parts):
            frame[name] = frame[name].astype("category")
    return frame


def _gather(kind: str, name: str, parts: list[Packed]) -> Column | Encoded:
    """One column from its packed parts: a categorical column that every part
    dictionary-encoded stays encoded (`_frame` makes its categories from the dictionary, not
    from millions of decoded labels); others are unpacked."""
    if name in _CATEGORIES.get(kind, ()) and parts and all(isinstance(p, Encoded) for p in parts):
        merged = concat(parts)
        assert isinstance(merged, Encoded)
        return merged
    return unpack(parts)


def categorical(encoded: Encoded) -> pd.Categorical:
    """The column `astype("category")` would make of the decoded labels, built from the
    dictionary: the dictionary's own categorical (its categories sorted, its dtype inferred
    as for the whole column) indexed by the codes, unused categories dropped."""
    used = np.bincount(encoded.codes, minlength=len(encoded.values)) > 0
    values = [value for value, kept in zip(encoded.values, used.tolist(), strict=True) if kept]
    remap = np.cumsum(used) - 1  # old dictionary code -> code among the used values
    dictionary = pd.Series(label_array(values)).astype("category")
    codes = dictionary.cat.codes.to_numpy()[remap[encoded.codes]]
    return pd.Categorical.from_codes(codes, dtype=dictionary.dtype)


def frame_of(kind: str, columns: dict[str, Packed]) -> pd.DataFrame:
    """The table of one kind from its packed columns (a missing column: no rows)."""
    return _frame(kind, {n: _gather(kind, n, [columns.get(n, [])]) for n in KEPT_COLUMNS[kind]})


def _frame(kind: str, columns: dict[str, Column | Encoded]) -> pd.DataFrame:
    """Build one table: fixed columns (missing fields are null), ints for rank/step/t0/t1."""
    names = list(KEPT_COLUMNS[kind])
    encoded = {name: v for name, v in columns.items() if isinstance(v, Encoded)}
    if len(columns[names[0]]):
        frame = pd.DataFrame(
            {name: categorical(v) if isinstance(v := columns[name], Encoded) else v
             for name in names},
            copy=False,
        )  # fmt: skip
    else:  # no rows: every column an object column (lists of nothing infer float)
        frame = pd.DataFrame(columns=names)
    for name in ("rank", "step", "t0", "t1"):
        if name in frame.columns:
            frame[name] = frame[name].astype("int64")
    for name in NUMERIC_COLUMNS.get(kind, ()):
        frame[name] = numeric_column(name, frame[name])
    for name in _CATEGORIES.get(kind, ()):
        if name not in encoded or not len(frame):
            frame[name] = frame[name].astype("category")
    return frame


def numeric_column(name: str, values: pd.Series) -> pd.Series:
    """A numeric field as the tables hold it: numbers as float64, anything else null, and
    infinities null too, but in `loss` (a diverged loss is data; an infinite byte count is
    not)."""
    try:
        numbers = pd.to_numeric(values, errors="coerce").astype("float64")
    except TypeError:  # lists or dicts where a number belongs: those become null
        kept = [v if finite(v) else None for v in values]
        numbers = pd.Series(kept, index=values.index, dtype="float64")
    return numbers if name == "loss" else numbers.where(np.isfinite(numbers))


def numbers_of(kind: str, name: str, packed: Packed) -> np.ndarray:
    """One packed numeric column of `kind` as `numeric_column` makes it, as an array (a
    float array, as the typed readers pack numbers, without pandas)."""
    if isinstance(packed, np.ndarray) and packed.dtype == np.float64:
        return packed if name == "loss" else np.where(np.isinf(packed), np.nan, packed)
    return numeric_column(name, pd.Series(_gather(kind, name, [packed]))).to_numpy()


def _drop_duplicate_steps(steps: pd.DataFrame, skipped: list[str]) -> pd.DataFrame:
    duplicated = steps.duplicated(["rank", "step"], keep="last")
    if duplicated.any():
        ranks = sorted(steps.loc[duplicated, "rank"].unique())
        files = ", ".join(schema.rank_file_name(int(r)) for r in ranks)
        skipped.append(
            f"{files}: {int(duplicated.sum())} repeated step records, the last of each kept"
        )
        steps = steps.loc[~duplicated].reset_index(drop=True)
    return steps
