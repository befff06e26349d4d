"""PyTorch profiler (Kineto) trace folders read as runs: `load_trace_dir(path)` -> RunData.

A user's own job profiled with `torch.profiler` and `tensorboard_trace_handler` leaves one
`*.pt.trace.json[.gz]` per rank; `diag analyze TRACE_DIR/` reads them like a run directory. Ranks
are parsed in parallel processes; the converted tables are cached (diag/read/kineto/cache.py) so the
next analysis of an unchanged folder skips the JSON entirely.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from diag.contract import schema
from diag.contract.names import grid_groups
from diag.errors import InputError
from diag.rankfile.rank_file import KEPT_COLUMNS
from diag.rankfile.records import Packed, pack
from diag.read.cache import Lookup
from diag.read.kineto import cache
from diag.read.kineto.batches import split_batches
from diag.read.kineto.device import DEVICE_TIME_FIELDS
from diag.read.kineto.files import ParsedTrace, assign_ranks, is_trace_dir, parse_file, trace_files
from diag.read.kineto.kernels import KernelPatterns
from diag.read.kineto.layout import GIVEN, FoundLayout, infer_layout
from diag.read.load import RunData, run_from_records, with_cache_note
from diag.read.parallel import map_chunks

__all__ = ["KernelPatterns", "is_trace_dir", "load_trace_dir"]

PARALLEL_FROM_BYTES = 8 * 2**20
"""Below this much trace on disk, one process parses faster than starting a pool."""


def load_trace_dir(
    path: str | Path,
    patterns: KernelPatterns | None = None,
    layout: schema.Layout | None = None,
    use_cache: bool = True,
    workers: int | None = None,
) -> RunData:
    """Load a folder of Kineto traces; raises InputError (one line) when it is unusable."""
    folder = Path(path)
    patterns = patterns or KernelPatterns()
    files = trace_files(folder)
    if not files:
        raise InputError(folder, "no Kineto trace files (*.json, *.json.gz) in the folder")
    layout = layout or _layout_beside(folder)
    key = cache.key(files, patterns, layout) if use_cache else ""
    found = cache.read(folder, key) if use_cache else Lookup()
    if isinstance(found.value, RunData):
        return found.value
    skipped: list[str] = []
    parsed = _parse_all(files, patterns, workers)
    spans_of = {id(trace): spans for trace, spans in parsed}
    traces = assign_ranks(folder, [trace for trace, _ in parsed], skipped)
    del parsed
    records: dict[str, list[dict]] = {"step": [], "span": [], "comm": []}
    span_parts = [spans_of.pop(id(trace)) for trace in traces]
    spans_of.clear()  # a skipped trace's spans go with it
    for trace in traces:
        for kind, rows in trace.records.items():
            records[kind] += rows
        if not trace.records.get("step"):
            skipped.append(f"{trace.path}: no events with a time (rank {trace.rank} has no steps)")
    manifest = _manifest(folder, traces, layout, records)
    grid = manifest.layout.dp * manifest.layout.tp * manifest.layout.pp * manifest.layout.ep
    if layout is not None and grid != manifest.world_size:
        raise InputError(folder, f"the layout's dp x tp x pp x ep = {grid} is not the traces' "
                                 f"world size {manifest.world_size}")  # fmt: skip
    missing = manifest.world_size - len(traces)
    if missing > 0:
        shown = ", ".join(str(t.rank) for t in traces[:8]) + (" ..." if len(traces) > 8 else "")
        skipped.append(
            f"{folder}: traces of {len(traces)} of {manifest.world_size} ranks ({shown}); "
            "the others are not analysed"
        )
    name_groups_by_axis(records["comm"], manifest)
    split_batches(records["comm"])
    run = dataclasses.replace(
        run_from_records(manifest, folder, records, skipped, {"span": span_parts}),
        device_time=_device_table(traces),
    )
    _add_message_columns(run.comms, records["comm"])
    if use_cache:
        cache.write(folder, key, run)
    return with_cache_note(run, found.note)


def _parse_all(
    files: list[Path], patterns: KernelPatterns, workers: int | None
) -> list[tuple[ParsedTrace, dict[str, Packed]]]:
    """Every file parsed (its spans packed: `_spans_packed`), in parallel processes when
    there are several and enough bytes to repay starting them (`workers` forces a count);
    progress on a terminal after a while (`diag.read.progress`)."""
    gc.freeze()  # what is alive now (the modules, mostly) out of the collector's full passes
    try:
        chunks = map_chunks(
            partial(_parse_chunk, patterns=patterns), list(enumerate(files)), count=workers,
            min_bytes=PARALLEL_FROM_BYTES, chunk_files=1, progress="trace files",
        )  # fmt: skip
    finally:
        gc.unfreeze()
    return [trace for chunk in chunks for trace in chunk]


def _parse_chunk(
    chunk: list[tuple[int, Path]], patterns: KernelPatterns
) -> list[tuple[ParsedTrace, dict[str, Packed]]]:
    return [_spans_packed(parse_file(path, patterns)) for _, path in chunk]


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


def _manifest(
    folder: Path,
    traces: list[ParsedTrace],
    layout: schema.Layout | None,
    records: dict[str, list[dict]],
) -> schema.Manifest:
    worlds = [t.world_size for t in traces if t.world_size]
    world_size = max([*worlds, max(int(t.rank or 0) for t in traces) + 1])
    if layout is not None:
        # the groups a job on this grid forms: the pipeline's neighbours pair its messages
        grid = layout.dp * layout.pp * layout.ep * layout.tp == world_size
        sizes = {"dp": layout.dp, "pp": layout.pp, "ep": layout.ep, "tp": layout.tp}
        found = FoundLayout(layout, grid_groups(sizes) if grid else {}, GIVEN)
    else:
        configs = [group for t in traces for group in t.pg_groups]
        found = infer_layout(world_size, configs, records["comm"], records["step"])
    backends = {t.backend for t in traces if t.backend}
    device = next((t.device_name for t in traces if t.device_name), None)
    on_device = any(t.on_device for t in traces)
    return schema.Manifest(
        run_id=folder.resolve().name,
        created=_dt.datetime.fromtimestamp(_newest_mtime(traces), _dt.UTC).isoformat(),
        world_size=world_size,
        trainer="kineto",
        command=None,
        backend=backends.pop() if len(backends) == 1 else None,
        device_type="cuda" if on_device else "cpu",
        layout=found.layout,
        groups=found.groups,
        layout_source=found.source,
        ranks=[schema.RankInfo(rank=int(t.rank or 0), device_name=device) for t in traces],
        status=schema.RunStatus.COMPLETE.value,
    )


def name_groups_by_axis(comms: list[dict], manifest: schema.Manifest) -> None:
    """Each collective whose process group's ranks are one of the manifest's groups is named
    by that group's axis (`dp`, `tp`, ...; an axis before `world` where both hold the same
    ranks): the trace's own names (`mesh_dp`, `pg3`, or one description for many groups) say
    nothing the analysis may rely on, the members do. Others keep the trace's name. The ranks
    are dropped from the records either way."""
    axis_of: dict[tuple[int, ...], str] = {}
    for axis, groups in manifest.groups.items():
        for members in groups:
            axis_of.setdefault(tuple(sorted(members)), axis)
    for comm in comms:
        members = comm.pop("group_ranks", None)
        named = axis_of.get(members) if members else None
        if named is not None:
            comm["group"] = named


MESSAGE_COLUMNS = ("peer", "seq")
"""Comm columns only a trace gives (not in the rank files' format): a message's other side
(global rank) and each record's place in its process group's order (comm_ops.py)."""


def _add_message_columns(comms: pd.DataFrame, records: list[dict]) -> None:
    """`peer` and `seq` on the comm table (rows in record order; null where unknown)."""
    for name in MESSAGE_COLUMNS:
        values = [record.get(name) for record in records]
        comms[name] = pd.array(values, dtype="Int64") if len(comms) == len(values) else pd.NA


def _newest_mtime(traces: list[ParsedTrace]) -> float:
    """When the newest trace was written: the run's date (the folder's own time changes when
    its cache is written)."""
    times = []
    for trace in traces:
        try:
            times.append(trace.path.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


def _device_table(traces: list[ParsedTrace]) -> pd.DataFrame:
    """Per rank, the device time measured from its kernels (`RunData.device_time`)."""
    rows = [{"rank": int(t.rank or 0), **dataclasses.asdict(t.device_time)}
            for t in traces if t.device_time is not None]  # fmt: skip
    return pd.DataFrame(rows, columns=["rank", *DEVICE_TIME_FIELDS])
