"""One rank file read: its records as packed columns by kind, and what was skipped and why.

The loader (`diag.read.load`) reads many of these, in worker processes for a large run, and turns
them into tables. A JSON-lines file takes the typed fast path (`diag.rankfile.records`) when every
line allows it, otherwise the line-by-line path that names every problem; an Arrow file is decoded
by `diag.rankfile.arrow_format`. Nothing here raises on bad input: what cannot be used is skipped
and noted.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diag.contract import schema
from diag.contract.files import read_regular
from diag.contract.limits import (
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    MAX_NOTES_PER_FILE,
    MAX_RANK_FILE_BYTES,
)
from diag.contract.schema import RecordKind
from diag.rankfile.arrow_format import SUFFIX
from diag.rankfile.record_checks import check_values, depth, float_tokens
from diag.rankfile.records import Column, Packed, concat, decode_rank_file, pack

STEP_COLUMNS = (
    "rank", "step", "t0", "t1", "tokens", "loss", "cpu_ns", "runq_ns", "nivcsw", "load1",
    "proc_cpu_ns", "proc_runq_ns",
)  # fmt: skip
SPAN_COLUMNS = ("rank", "step", "mb", "phase", "stage", "chunk", "t0", "t1")
COMM_COLUMNS = (
    "rank", "step", "op", "group", "group_size", "bytes", "dtype", "t0", "t1",
    "expected_bytes", "tag", "async", "blocking",
)  # fmt: skip
MEMORY_COLUMNS = (
    "rank", "step", *schema.MEMORY_CATEGORIES, "device_peak", "host_rss", "source",
)  # fmt: skip
EXPERTS_COLUMNS = ("rank", "step", "layer", "tokens", "dropped", "capacity", "aux_loss")
EVENT_COLUMNS = ("rank", "step", "name", "fields")
"""Events keep their free fields as one dict per row in `fields`."""

KEPT_COLUMNS: dict[str, tuple[str, ...]] = {
    RecordKind.STEP.value: STEP_COLUMNS,
    RecordKind.SPAN.value: SPAN_COLUMNS,
    RecordKind.COMM.value: COMM_COLUMNS,
    RecordKind.MEM.value: MEMORY_COLUMNS,
    RecordKind.EXPERTS.value: EXPERTS_COLUMNS,
    RecordKind.EVENT.value: EVENT_COLUMNS,
}
NUMERIC_COLUMNS: dict[str, tuple[str, ...]] = {
    RecordKind.STEP.value: (
        "tokens",
        "loss",
        "cpu_ns",
        "runq_ns",
        "nivcsw",
        "load1",
        "proc_cpu_ns",
        "proc_runq_ns",
    ),
    RecordKind.COMM.value: ("group_size", "bytes", "expected_bytes"),
    RecordKind.MEM.value: (*schema.MEMORY_CATEGORIES, "device_peak", "host_rss"),
    RecordKind.EXPERTS.value: ("dropped", "capacity", "aux_loss"),
}


@dataclass
class RankFile:
    """One rank file parsed: its records as columns by kind (rank included), what was skipped
    and why, and how many step records have a NaN loss (kept: a diverged loss is data)."""

    columns: dict[str, dict[str, Packed]]
    skipped: list[str]
    nan_loss: int = 0


def read_rank_file(rank: int, file: Path) -> RankFile:
    """Parse one rank file: the typed fast path (`diag.rankfile.records`) when every line allows it,
    otherwise line by line, noting what is skipped and why."""
    try:
        data = read_regular(file, MAX_RANK_FILE_BYTES)
    except OSError as err:
        return RankFile(
            pack(as_columns({})),
            [f"{file.name}: cannot read ({err.strerror or err}), rank {rank} not analysed"],
        )
    except MemoryError:  # within the bound, but more than this machine has free
        return RankFile(
            pack(as_columns({})),
            [f"{file.name}: not enough memory to read it, rank {rank} not analysed"],
        )
    if not data or data.isspace():
        return RankFile(pack(as_columns({})), [f"{file.name}: empty, rank {rank} not analysed"])
    if file.name.endswith(SUFFIX):
        return _read_arrow(data, rank, file.name)
    decoded = None if _has_long_line(data) else decode_rank_file(data, KEPT_COLUMNS)
    events = None if decoded is None else _event_rows(decoded.event_lines, rank)
    if decoded is None or events is None:
        return _read_lines(data, rank, file.name)
    columns = decoded.columns
    columns[RecordKind.EVENT.value] = as_columns({RecordKind.EVENT.value: events})[
        RecordKind.EVENT.value
    ]
    for table in columns.values():
        table["rank"] = [rank] * len(table["step"])
    skipped = [
        f"{file.name}: {count} {'record' if count == 1 else 'records'} skipped "
        f"({kind} record with t1 before t0)"
        for kind, count in decoded.reversed_times.items()
    ]
    return RankFile(pack(columns, floats=NUMERIC_COLUMNS), skipped)


def _read_arrow(data: bytes, rank: int, name: str) -> RankFile:
    """An Arrow rank file (diag/rankfile/arrow_format.py): typed columns straight from its batches;
    records that fit no typed schema were written as JSON lines and take the checked path."""
    from diag.rankfile import arrow_fast  # rank files only: not imported by a trace analysis

    decoded = arrow_fast.decode(data, name, KEPT_COLUMNS, NUMERIC_COLUMNS)
    if decoded.fatal:
        return RankFile(pack(as_columns({})), [f"{decoded.skipped[0]}, rank {rank} not analysed"])
    columns = decoded.columns
    for table in columns.values():
        table["rank"] = np.full(len(table["step"]), rank, dtype=np.int64)
    part = RankFile(columns, decoded.skipped, decoded.nan_loss)
    if not decoded.other_lines:
        return part
    lines = _read_lines(b"\n".join(decoded.other_lines), rank, f"{name} (JSON records)")
    for kind, table in columns.items():
        extra = lines.columns[kind]
        if len(extra["step"]):  # the meta record alone adds no rows
            part.columns[kind] = {col: concat([table[col], extra[col]]) for col in table}
    part.skipped += lines.skipped
    part.nan_loss += lines.nan_loss
    return part


def _has_long_line(data: bytes) -> bool:
    """Whether a line is longer than MAX_LINE_BYTES: one search from the end of each window
    of that size, so a file of short lines costs a few steps per MiB."""
    start = 0
    while len(data) - start > MAX_LINE_BYTES:
        newline = data.rfind(b"\n", start, start + MAX_LINE_BYTES + 1)
        if newline < 0:
            return True
        start = newline + 1
    return False


def _event_rows(lines: list[bytes], rank: int) -> list[dict[str, Any]] | None:
    """The fast path's event lines as rows; None when one nests too deeply (the line-by-line
    path notes it)."""
    rows = []
    for line in lines:
        try:
            record = json.loads(line)
        except RecursionError:
            return None
        if depth(record) > MAX_JSON_DEPTH:
            return None
        rows.append(_event_row({**record, "rank": rank}))
    return rows


_BAD_JSON = "not valid JSON (truncated?)"
_TOO_DEEP = "nested too deeply to parse"
_TOO_LONG = f"longer than {MAX_LINE_BYTES // 2**20} MiB"


def _read_lines(data: bytes, rank: int, name: str) -> RankFile:
    """The line-by-line path: every record checked on its own, with the reason it is not used."""
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    bad_lines: dict[str, list[int]] = defaultdict(list)  # reason -> line numbers
    rejected: Counter[str] = Counter()
    nan_loss = 0
    for lineno, line in bounded_lines(data):
        if line is None:
            bad_lines[_TOO_LONG].append(lineno)
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except RecursionError:
            bad_lines[_TOO_DEEP].append(lineno)
            continue
        except ValueError:
            bad_lines[_BAD_JSON].append(lineno)
            continue
        reason = schema.check_record(record) or check_values(record)
        if reason:
            rejected[reason] += 1
            continue
        kind = record["kind"]
        if kind not in KEPT_COLUMNS:
            continue
        record["rank"] = rank
        record = float_tokens(record)
        if kind == RecordKind.EVENT.value:
            record = _event_row(record)
        elif kind == RecordKind.STEP.value and _is_nan(record.get("loss")):
            nan_loss += 1
        records[kind].append(record)
    skipped: list[str] = []
    for why, lines in bad_lines.items():
        if len(lines) == 1:
            skipped.append(f"{name} line {lines[0]}: {why}, skipped")
        else:
            skipped.append(f"{name}: {len(lines)} lines {why}, skipped (first at line {lines[0]})")
    for i, (reason, count) in enumerate(rejected.items()):
        if i == MAX_NOTES_PER_FILE:
            rest = sum(list(rejected.values())[i:])
            skipped.append(f"{name}: {rest} more records skipped ({len(rejected) - i} other "
                           "reasons)")  # fmt: skip
            break
        plural = "record" if count == 1 else "records"
        skipped.append(f"{name}: {count} {plural} skipped ({reason})")
    return RankFile(_packed(records), skipped, nan_loss)


def bounded_lines(data: bytes) -> Iterator[tuple[int, bytes | None]]:
    """Each line of `data` with its number, None for one longer than MAX_LINE_BYTES: a line is
    copied out only when it is short enough to parse (splitting the file whole would copy it
    all, a 2 GiB line included)."""
    start, lineno = 0, 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        lineno += 1
        yield lineno, data[start:end] if end - start <= MAX_LINE_BYTES else None
        start = end + 1


def _packed(records: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Packed]]:
    """`pack(as_columns(records))`, the kinds without records given one empty table's packed
    columns made once (packing them cost 0.09 ms a file, most of reading an Arrow rank
    file's one JSON record, its meta record)."""
    columns = {kind: dict(table) for kind, table in _NO_RECORDS.items()}
    for kind, rows in records.items():
        if rows and kind in KEPT_COLUMNS:
            table: dict[str, Column] = {n: [row.get(n) for row in rows] for n in KEPT_COLUMNS[kind]}
            columns[kind] = pack({kind: table})[kind]
    return columns


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _event_row(record: dict[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in record.items() if k not in ("kind", "step", "name", "rank")}
    return {
        "rank": record["rank"],
        "step": record["step"],
        "name": record["name"],
        "fields": fields,
    }


def as_columns(records: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Column]]:
    return {
        kind: {name: [row.get(name) for row in records.get(kind, [])] for name in names}
        for kind, names in KEPT_COLUMNS.items()
    }


_NO_RECORDS = pack(as_columns({}))
"""Every kind's packed columns without rows (`_packed` copies each kind's table, never its
columns: empty arrays and dictionaries, which nothing changes in place)."""
