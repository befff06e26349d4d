"""PyTorch profiler (Kineto) trace folders read as runs: `load_trace_dir(path)` -> RunData.

A user's own job profiled with `torch.profiler` and `tensorboard_trace_handler` leaves one
`*.pt.trace.json[.gz]` per rank; `diag analyze TRACE_DIR/` reads them like a run directory. Ranks
are parsed in parallel processes; the converted tables are cached (diag/read/kineto/cache.py) so the
next analysis of an unchanged folder skips the JSON entirely.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from diag.contract import schema
from diag.contract.files import open_regular
from diag.contract.limits import MAX_TRACE_FILE_BYTES
from diag.contract.peers import stand_in_links
from diag.errors import InputError
from diag.rankfile.rank_file import KEPT_COLUMNS
from diag.rankfile.records import Packed, pack
from diag.read import memory_budget
from diag.read.cache import Lookup
from diag.read.kineto import cache, clocks, placement, spill
from diag.read.kineto.batches import KERNEL_KEY
from diag.read.kineto.device import DEVICE_TIME_FIELDS
from diag.read.kineto.files import ParsedTrace, parse_file
from diag.read.kineto.grid_placement import PlacementMarks
from diag.read.kineto.kernels import KernelPatterns
from diag.read.kineto.manifest import axis_of, folder_manifest
from diag.read.kineto.packed_comms import (
    MESSAGE_COLUMNS,
    LayoutKey,
    LayoutRows,
    Message,
    PackedComms,
    message_column,
    named_by_axis,
    named_by_placement,
    pack_comms,
    split_packed_batches,
)
from diag.read.kineto.placement import grid_size
from diag.read.kineto.trace_folder import is_trace_dir, trace_files
from diag.read.kineto.trace_ranks import assign_ranks
from diag.read.kineto.window import Reduced, reduce_spilled, reduce_traces, window_end
from diag.read.kineto.window import note as window_note
from diag.read.load import (
    REDUCE_SPANS_FROM_BYTES,
    Breakdown,
    RunData,
    run_from_records,
    with_cache_note,
)
from diag.read.parallel import file_sizes, map_chunks, planned, scheduler_address
from diag.read.parallel import workers as parallel_workers
from diag.read.scratch import owned_folder, remove_stale

if TYPE_CHECKING:
    from diag.read.distributed_scheduler import KeptOnCluster

__all__ = ["KernelPatterns", "is_trace_dir", "load_trace_dir"]

PARALLEL_FROM_BYTES = 8 * 2**20
"""Below this much trace on disk, one process parses faster than starting a pool."""
SPILL_PREFIX, SPILL_NAMES = "diag-spill-", r"\d+\.npz"
"""The spill's scratch folders (scratch.py), and the only files they hold (`_spilled`)."""


def load_trace_dir(
    path: str | Path,
    patterns: KernelPatterns | None = None,
    layout: schema.Layout | None = None,
    use_cache: bool = True,
    workers: int | None = None,
    breakdown: Breakdown | None = None,
) -> RunData:
    """Load a folder of Kineto traces, or one trace file (a single rank's, as a user often
    has it); raises InputError (one line) when it is unusable. `breakdown` (the metrics'
    `reduce_rank_files`, as `diag.api` hands it): a folder of more than
    REDUCE_SPANS_FROM_BYTES is reduced with it, as a large run directory is (window.py);
    without one every record is kept."""
    folder = Path(path)
    patterns = patterns or KernelPatterns()
    # one file is read as a folder of that file alone; its cache sits beside it, in its folder
    beside = folder.parent if folder.is_file() else folder
    files = [folder] if folder.is_file() else trace_files(folder)
    if not files:
        raise InputError(folder, "no Kineto trace files (*.json, *.json.gz) in the folder")
    layout = layout or _layout_beside(beside)
    large = sum(_text_sizes(files)) >= REDUCE_SPANS_FROM_BYTES
    reduce = breakdown if large else None
    key = cache.key(files, patterns, layout, reduce is not None) if use_cache else ""
    found = cache.read(beside, key) if use_cache else Lookup()
    if isinstance(found.value, RunData):
        return found.value
    # a large folder: each trace's records wait until the layout is known (window.
    # reduce_spilled), on this machine's disk, or on a cluster with the worker that parsed it
    how_read: list[str] = []  # notes on this read, not on the data: never cached
    with _waiting_room(reduce is not None) as where:
        run = _loaded(folder, files, patterns, layout, reduce, workers, where, how_read)
    run = clocks.aligned(run)  # each host's profiler wrote its own clock
    if use_cache:
        cache.write(beside, key, run)
    if how_read:
        run = dataclasses.replace(run, skipped=[*run.skipped, *how_read])
    return with_cache_note(run, found.note)


def _loaded(
    folder: Path,
    files: list[Path],
    patterns: KernelPatterns,
    layout: schema.Layout | None,
    reduce: Breakdown | None,
    workers: int | None,
    spill_to: Path | KeptOnCluster | None,
    how_read: list[str],
) -> RunData:
    skipped: list[str] = []
    parsed = _parse_all(files, patterns, workers, spill_to, how_read)
    packed_of = {id(trace): (spans, comms) for trace, spans, comms in parsed}
    traces = assign_ranks(folder, [trace for trace, _, _ in parsed], skipped)
    del parsed
    records: dict[str, list[dict]] = {"step": [], "span": [], "comm": []}
    span_parts, comm_parts = zip(*[packed_of.pop(id(trace)) for trace in traces], strict=True)
    packed_of.clear()  # a skipped trace's records go with it
    for trace in traces:
        for kind, rows in trace.records.items():
            records[kind] += rows
        if not trace.records.get("step"):
            skipped.append(f"{trace.path}: no events with a time (rank {trace.rank} has no steps)")
    manifest = folder_manifest(folder, traces, layout, records, list(comm_parts), skipped)
    for part in comm_parts:  # counted: no longer needed
        part.layout_rows = Counter()
    grid = grid_size(manifest.layout)
    if layout is not None and grid != manifest.world_size:
        raise InputError(folder, f"the layout's dp x tp x pp x ep x cp = {grid} is not the "
                                 f"traces' world size {manifest.world_size}")  # fmt: skip
    missing = manifest.world_size - len(traces)
    if missing > 0:
        shown = ", ".join(str(t.rank) for t in traces[:8]) + (" ..." if len(traces) > 8 else "")
        skipped.append(
            f"{folder}: traces of {len(traces)} of {manifest.world_size} ranks ({shown}); "
            "the others are not analysed"
        )
    axes = axis_of(manifest)
    records_count = sum(_rows(p) for p in span_parts) + sum(len(p) for p in comm_parts)
    spilled = [p for p in comm_parts if isinstance(p, Spilled)]
    # an older trace's ops, named by none of its groups, in a layout given or read from them
    by_placement = layout is not None or placement.named_by_placement_in(manifest.layout_source)
    unnamed = by_placement and any(None in p.members for p in comm_parts)
    if (
        reduce is not None
        and spilled
        and len(spilled) == len(comm_parts)
        and not unnamed
        and not any(p.batched for p in spilled)
    ):
        # every trace on disk and no op whose naming reads other traces' ops: reduced by workers
        end = window_end([t.records["step"] for t in traces], records_count, manifest.world_size)
        kept = spill_to if not isinstance(spill_to, Path) else None
        reduced = reduce_spilled(reduce, [p.where for p in spilled], axes, end, workers, kept)
        del span_parts, comm_parts, spilled
        return _run(folder, manifest, traces, records, skipped, reduced)
    span_parts, comm_parts = _read_back(span_parts, comm_parts, spill_to)
    comm_columns = [named_by_axis(part, axes) for part in comm_parts]
    if by_placement:
        comm_columns = named_by_placement(comm_parts, comm_columns, manifest.layout)
    # a batched kernel's ops given their own ends and waits from their peers' ops (batches.py)
    traced = {int(t.rank) for t in traces if t.rank is not None}
    links = stand_in_links(manifest, traced) if missing > 0 else {}
    comm_columns = split_packed_batches(comm_parts, comm_columns, links)
    spans, comms = list(span_parts), list(comm_parts)
    del span_parts, comm_parts
    if reduce is not None:
        # a large folder: every step reduced, the records kept for a window (window.py)
        end = window_end([t.records["step"] for t in traces], records_count, manifest.world_size)
        reduced = reduce_traces(reduce, [t.records["step"] for t in traces], spans, comms,
                                comm_columns, end)  # fmt: skip
        return _run(folder, manifest, traces, records, skipped, reduced)
    return _run(folder, manifest, traces, records, skipped, None, spans, comms, comm_columns)


def _run(
    folder: Path,
    manifest: schema.Manifest,
    traces: list[ParsedTrace],
    records: dict[str, list[dict]],
    skipped: list[str],
    reduced: Reduced | None,
    spans: list[dict[str, Packed]] | None = None,
    comms: list[PackedComms] | None = None,
    comm_columns: list[dict[str, Packed]] | None = None,
) -> RunData:
    """The run's tables from the traces' records: every record (`spans`, `comms` and their
    named `comm_columns`), or a large folder's window and reductions (`reduced`)."""
    if reduced is not None:
        spans, comms = reduced.spans, reduced.comms
        comm_columns = [part.columns for part in comms]
        first = min((s["step"] for s in records["step"]), default=0)
        skipped.append(window_note(folder, reduced.keep_below, first))
    assert spans is not None and comms is not None and comm_columns is not None
    run = dataclasses.replace(
        run_from_records(manifest, folder, records, skipped, {"span": spans, "comm": comm_columns}),
        device_time=_device_table(traces),
    )
    del comm_columns
    for name in MESSAGE_COLUMNS:  # `peer` and `seq` (null where unknown)
        run.comms[name] = message_column(comms, name, len(run.comms))
    if reduced is not None:
        run = dataclasses.replace(
            run, rank_steps=reduced.rank_steps, comm_totals=reduced.comm_totals,
            span_steps=reduced.keep_below,
        )  # fmt: skip
    return run


@dataclass
class Spilled:
    """A parsed trace's spans and collectives kept by its worker, `where`: a file on this
    machine (spill.py), or on a Dask cluster, (the index of the kept chunk, the trace's
    position in it) (`KeptOnCluster`); and what the gathering process reads of them before
    they are reduced: their numbers, what the layout's inference counts, the groups' rank
    lists, and whether a batched kernel ran several ops (their split reads every trace's
    ops: then they are read back)."""

    where: Path | tuple[int, int]
    span_rows: int
    comm_rows: int
    layout_rows: LayoutRows | Counter[LayoutKey]
    members: list[tuple[int, ...] | None]
    batched: bool
    marks: PlacementMarks
    ranks_named: int  # PackedComms.ranks_named

    def __len__(self) -> int:
        return self.comm_rows


Parsed = tuple[ParsedTrace, "dict[str, Packed] | Spilled", "PackedComms | Spilled"]


MAX_DEFLATE_RATIO = 1032
"""The most a deflate stream inflates (258 bytes from each 2-bit code, at best)."""


def _text_sizes(files: list[Path]) -> list[int]:
    """Each trace's JSON size in bytes: a gzipped one's as its trailer says (the inflated size
    modulo 2**32; never less than on disk), since the reduction is for what the text holds,
    which a gzipped folder's size on disk hides about tenfold. Only a choice of path: a
    trailer that lies changes no result's correctness."""
    sizes = file_sizes([(0, f) for f in files])
    for i, path in enumerate(files):
        if path.name.endswith(".gz") and sizes[i] >= 18:  # a header and a trailer
            try:
                with open_regular(path, MAX_TRACE_FILE_BYTES) as raw:
                    raw.seek(-4, 2)
                    inflated = int.from_bytes(raw.read(4), "little")
                # deflate inflates at most ~1032-fold: more is no size but a file cut short
                # (the trailer's place holds compressed data), read at its size on disk
                if inflated <= MAX_DEFLATE_RATIO * sizes[i]:
                    sizes[i] = max(sizes[i], inflated)
            except OSError:
                continue
    return sizes


def _parse_all(
    files: list[Path],
    patterns: KernelPatterns,
    workers: int | None,
    spill_to: Path | KeptOnCluster | None = None,
    notes: list[str] | None = None,
) -> list[Parsed]:
    """Every file parsed (its spans and collectives packed: `_packed`; kept by the worker when
    `spill_to` is given: written to that folder, or kept on the cluster: `Spilled`), in
    parallel processes when there are several and enough bytes to repay starting them
    (`workers` forces a count), as many at once as the memory budget allows
    (memory_budget.py: a line in `notes` where it held them back); progress on a terminal
    after a while (`diag.read.progress`)."""
    notes = [] if notes is None else notes
    if spill_to is not None and not isinstance(spill_to, Path):
        files_in, done = planned(list(enumerate(files)), 1, 1, "trace files")
        parse = partial(_parse_chunk, patterns=patterns)
        return [trace for chunk in spill_to.map(parse, files_in, _kept, done) for trace in chunk]
    budget = memory_budget.admission(_text_sizes(files))
    chunks = map_chunks(
        partial(_parse_chunk, patterns=patterns, spill_to=spill_to), list(enumerate(files)),
        count=workers, min_bytes=PARALLEL_FROM_BYTES, chunk_files=1, progress="trace files",
        admission=budget,
    )  # fmt: skip
    if budget is not None and (line := budget.note(min(workers or parallel_workers(), len(files)))):
        notes.append(line)
    return [trace for chunk in chunks for trace in chunk]


def _parse_chunk(
    chunk: list[tuple[int, Path]], patterns: KernelPatterns, spill_to: Path | None = None
) -> list[Parsed]:
    out: list[Parsed] = []
    for index, path in chunk:
        trace, spans, comms = _packed(parse_file(path, patterns))
        out.append(
            _spilled(index, trace, spans, comms, spill_to) if spill_to else (trace, spans, comms)
        )
    return out


def _spilled(
    index: int, trace: ParsedTrace, spans: dict[str, Packed], comms: PackedComms, folder: Path
) -> Parsed:
    """The trace with its packed records written to `folder` (as is where they will not be)."""
    path = folder / f"{index}.npz"
    if trace.error or not spill.write(path, trace.records.get("step", []), spans, comms):
        return trace, spans, comms
    found = _summary(path, spans, comms)
    return trace, found, found


def _kept(chunk: list[Parsed], index: int) -> list[Parsed]:
    """(On the cluster's worker that parsed chunk `index` and keeps it) what comes back of it:
    each trace with its packed records' summary (`Spilled`), as a spilled trace's."""
    out: list[Parsed] = []
    for position, (trace, spans, comms) in enumerate(chunk):
        if trace.error or isinstance(spans, Spilled) or isinstance(comms, Spilled):
            out.append((trace, spans, comms))
            continue
        found = _summary((index, position), spans, comms)
        out.append((trace, found, found))
    return out


def _summary(
    where: Path | tuple[int, int], spans: dict[str, Packed], comms: PackedComms
) -> Spilled:
    """What the gathering process reads of a trace whose packed records wait `where`."""
    kernels = comms.messages.get(KERNEL_KEY, [])
    batched = (
        bool((~kernels.null).any())
        if isinstance(kernels, Message)
        else any(v is not None for v in kernels)
    )
    return Spilled(
        where, _rows(spans), len(comms), comms.layout_rows, comms.members, batched, comms.marks,
        comms.ranks_named,
    )  # fmt: skip


def _read_back(
    span_parts: tuple[Any, ...], comm_parts: tuple[Any, ...], kept: Path | KeptOnCluster | None
) -> tuple[list[dict[str, Packed]], list[PackedComms]]:
    """Spilled traces read back into memory (the others as they are)."""
    spans, comms = [], []
    for span_part, comm_part in zip(span_parts, comm_parts, strict=True):
        if isinstance(comm_part, Spilled) and isinstance(comm_part.where, Path):
            _, span_part, packed = spill.read(comm_part.where)
            comm_part.where.unlink(missing_ok=True)
            comm_part = packed
        elif isinstance(comm_part, Spilled):
            assert kept is not None and not isinstance(kept, Path)
            assert not isinstance(comm_part.where, Path)
            chunk, position = comm_part.where
            _, span_part, comm_part = kept.fetch(chunk)[position]
        spans.append(span_part)
        comms.append(comm_part)
    return spans, comms


def _rows(spans: dict[str, Packed] | Spilled) -> int:
    if isinstance(spans, Spilled):
        return spans.span_rows
    return len(spans["t0"]) if "t0" in spans else 0


@contextlib.contextmanager
def _waiting_room(large: bool) -> Iterator[Path | KeptOnCluster | None]:
    """Where a large folder's packed records wait for the layout: a private folder of this
    machine (scratch.py), or the cluster's workers (`KeptOnCluster`) when the traces are
    parsed there; None (they come back here) for a folder that is not large."""
    address = scheduler_address()
    if not large:
        remove_stale(SPILL_PREFIX, SPILL_NAMES)  # a killed analysis's, whatever this one does
        yield None
    elif address is None:
        with owned_folder(SPILL_PREFIX, SPILL_NAMES) as folder:
            yield folder
    else:
        from diag.read.distributed_scheduler import kept_on_cluster  # Dask only when asked for

        with kept_on_cluster(address) as kept:
            yield kept


def _packed(trace: ParsedTrace) -> tuple[ParsedTrace, dict[str, Packed], PackedComms]:
    """The trace with its spans and collectives packed (`_spans_packed`, `pack_comms`): no
    record dicts but the steps' cross to the gathering process."""
    trace, spans = _spans_packed(trace)
    comms = pack_comms(trace.records.pop("comm", []), trace.records.get("step", []))
    trace.records["comm"] = []
    return trace, spans, comms


def _spans_packed(trace: ParsedTrace) -> tuple[ParsedTrace, dict[str, Packed]]:
    """The trace without its span records, and those as packed columns. Spans are most of a
    trace's records and nothing reads them as dicts after the parse: packed in the worker,
    they cross to the gathering process as arrays and encoded labels, not as one dict each
    (about 600 bytes a span there, and pickled). Where a column will not pack (a value of
    an unexpected type), the plain columns, which the table takes as it took the dicts."""
    spans = trace.records.pop("span", [])
    columns: dict[str, list[Any]] = {
        name: [row.get(name) for row in spans] for name in KEPT_COLUMNS["span"]
    }
    try:
        packed = pack({"span": dict(columns)})["span"]
    except (TypeError, ValueError, OverflowError):
        packed = dict(columns)
    trace.records["span"] = []
    return trace, packed


def _layout_beside(folder: Path) -> schema.Layout | None:
    """The layout of the run a `--profile-steps` window belongs to (RUN/traces/ -> RUN/)."""
    try:
        return schema.read_manifest(folder.parent).layout
    except (OSError, ValueError, schema.SchemaError):
        return None


def _device_table(traces: list[ParsedTrace]) -> pd.DataFrame:
    """Per rank, the device time measured from its kernels (`RunData.device_time`)."""
    rows = [{"rank": int(t.rank or 0), **dataclasses.asdict(t.device_time)}
            for t in traces if t.device_time is not None]  # fmt: skip
    return pd.DataFrame(rows, columns=["rank", *DEVICE_TIME_FIELDS])
