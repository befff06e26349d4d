"""The columnar rank file `rank-NNNNN.arrows`: one Arrow IPC stream per rank (docs/run-format.md,
"Arrow rank files"), written by the collectors and `diag simulate`, read by `diag.read.load`.

The stream's schema has one column per record kind, each a list of a typed struct (that kind's
schema), and one `other` column of JSON lines. Every flush (at least one a step) appends one
record batch of one row: the records of that flush, each kind in its own typed list. A record
that fits no typed schema (an unknown kind, a label that is an integer, a missing required
field) travels as its JSON line in `other`, and the reader sends those lines through the JSONL
loader's checked path, so nothing a JSONL file can say is lost. Fields a typed schema does not
name are kept as one JSON object per record (`extra`): an event's free fields, a step's
device samples.

The writer appends each batch as one encapsulated IPC message with one `write()`, so a rank
killed by SIGKILL leaves every flushed batch whole; the reader stops at the first incomplete
or unreadable message and says how many batches it kept.

Reading is for hostile input: the file is read whole (what a JSONL rank file costs) and the stream
is decoded from that buffer, so a message that declares a larger body than the file holds fails
instead of allocating it; compressed bodies and dictionary batches (which would let a few bytes
declare gigabytes) are refused; each batch is validated in full before use. The batches' columns are
then concatenated once for the file, and each kind's records checked and packed for the loader
column by column (diag/rankfile/arrow_checks.py).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from diag.contract import schema
from diag.contract.limits import (
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    MAX_NOTES_PER_FILE,
)
from diag.rankfile.arrow_checks import event_fields, packed, usable
from diag.rankfile.arrow_messages import is_compressed
from diag.rankfile.record_checks import depth
from diag.rankfile.records import INT_COLUMNS, Encoded, Packed

FORMAT_KEY = b"diag.format"
FORMAT_VALUE = b"diag.run/1 arrows 1"
"""Schema metadata naming the format and its version (a reader refuses other values)."""
SUFFIX = ".arrows"
EXTRA = "extra"
"""In every kind's struct: the record's fields that the typed schema does not name, as one
JSON object text (null when none)."""
OTHER = "other"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""Arrow's end-of-stream marker, written when a writer closes (a killed rank has none)."""

_I64, _F64, _STR, _BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()
_MEMORY_FIELDS = tuple((name, _F64) for name in (*schema.MEMORY_CATEGORIES, "device_peak",
                                                  "host_rss"))  # fmt: skip
KIND_FIELDS: dict[str, tuple[tuple[str, pa.DataType], ...]] = {
    "step": (
        ("step", _I64), ("t0", _I64), ("t1", _I64), ("tokens", _F64), ("loss", _F64),
        ("cpu_ns", _I64), ("runq_ns", _I64), ("nivcsw", _I64), ("load1", _F64),
        ("proc_cpu_ns", _I64), ("proc_runq_ns", _I64),
    ),
    "span": (
        ("step", _I64), ("phase", _STR), ("mb", _I64), ("stage", _I64), ("chunk", _I64),
        ("t0", _I64), ("t1", _I64),
    ),
    "comm": (
        ("step", _I64), ("op", _STR), ("group", _STR), ("group_size", _F64), ("bytes", _F64),
        ("dtype", _STR), ("t0", _I64), ("t1", _I64), ("expected_bytes", _F64), ("tag", _STR),
        ("async", _BOOL), ("blocking", _BOOL),
    ),
    "mem": (("step", _I64), *_MEMORY_FIELDS, ("source", _STR)),
    "experts": (
        ("step", _I64), ("layer", _I64), ("tokens", pa.list_(_F64)), ("dropped", _F64),
        ("capacity", _F64), ("aux_loss", _F64),
    ),
    "event": (("step", _I64), ("name", _STR)),
}  # fmt: skip
"""The typed fields of each record kind (every one nullable but `step`, `t0`, `t1`)."""
NOT_NULL = frozenset({"step", "t0", "t1"})
ADDED_FIELDS: dict[str, frozenset[str]] = {
    "step": frozenset(
        {"cpu_ns", "runq_ns", "nivcsw", "load1", "proc_cpu_ns", "proc_runq_ns"}
    ),  # the host (collectors/host.py)
}
"""Typed fields added after the format's first files: a file without them reads them as null."""


def kind_type(kind: str) -> pa.StructType:
    return pa.struct([pa.field(n, t) for n, t in KIND_FIELDS[kind]] + [pa.field(EXTRA, _STR)])


STREAM_SCHEMA = pa.schema(
    [pa.field(kind, pa.list_(kind_type(kind))) for kind in KIND_FIELDS]
    + [pa.field(OTHER, pa.list_(_STR))],
    metadata={FORMAT_KEY: FORMAT_VALUE},
)


def rank_file_name(rank: int) -> str:
    return schema.rank_file_name(rank, SUFFIX)


def stream_header() -> bytes:
    """The stream's first message (its schema), written once when a rank file is created."""
    return STREAM_SCHEMA.serialize().to_pybytes()


# --- writing -------------------------------------------------------------------------------------
_REQUIRED = {kind: tuple(schema.REQUIRED_FIELDS.get(kind, ())) for kind in KIND_FIELDS}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63
_NOT_NULL_OF = {
    kind: tuple(n for n, _ in KIND_FIELDS[kind] if n in NOT_NULL) for kind in KIND_FIELDS
}


def _fits(value: Any, kind: pa.DataType) -> bool:
    if value is None:
        return True
    cls = type(value)
    if kind is _I64:
        return cls is int and _INT64_MIN <= value < _INT64_MAX
    if kind is _F64:
        return cls is float or cls is int
    if kind is _STR:
        return cls is str
    if kind is _BOOL:
        return cls is bool
    return cls is list and all(type(v) is float or type(v) is int for v in value)


_JSON = json.JSONEncoder(separators=(",", ":"), default=str)
"""One encoder for every call: `json.dumps` with options builds a new one each time, which is
most of the cost of a record's few free fields (a comm record's `seq`)."""


def json_text(value: Any) -> str:
    # default=str: a collector must never fail on a field it cannot encode (JSONL: the same)
    return _JSON.encode(value)


def encode_batch(records: Iterable[Mapping[str, Any]]) -> bytes:
    """One flush's records as one encapsulated IPC message (a record batch of one row)."""
    row: dict[str, list[Any]] = {kind: [] for kind in KIND_FIELDS}
    other: list[str] = []
    for record in records:
        kind = record.get("kind")
        fields = KIND_FIELDS.get(kind) if isinstance(kind, str) else None
        if (
            fields is None
            or not isinstance(kind, str)
            or any(name not in record for name in _REQUIRED[kind])
            or any(record.get(name) is None for name in _NOT_NULL_OF[kind])
            or not all(_fits(record.get(name), kind_of) for name, kind_of in fields)
        ):
            other.append(json_text(record))
            continue
        typed = {name: record.get(name) for name, _ in fields}
        rest = {k: v for k, v in record.items() if k not in typed and k != "kind"}
        typed[EXTRA] = json_text(rest) if rest else None
        row[kind].append(typed)
    # one conversion per kind present (a kind's rows as dicts: a single call into Arrow);
    # kinds without records this flush reuse a prebuilt empty list
    row[OTHER] = other
    columns = [
        pa.array([row[f.name]], type=f.type) if row[f.name] else _EMPTY[f.name]
        for f in STREAM_SCHEMA
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=STREAM_SCHEMA)
    return batch.serialize().to_pybytes()


_EMPTY = {f.name: pa.array([[]], type=f.type) for f in STREAM_SCHEMA}


def encode_columns(
    world: int,
    tables: Mapping[str, tuple[np.ndarray, dict[str, pa.Array]]],
    other: list[str] | None = None,
) -> pa.RecordBatch:
    """Every rank's records of one flush as one batch of `world` rows (row r: rank r's), from
    each kind's columns over all records: (rank of each record, sorted; typed arrays by field
    name, missing fields null). The simulator writes row r of it to rank r's file."""
    columns = []
    for kind in KIND_FIELDS:
        struct_type = kind_type(kind)
        ranks, arrays = tables.get(kind, (np.zeros(0, np.int64), {}))
        count = len(ranks)
        children = [
            arrays[f.name] if f.name in arrays else pa.nulls(count, f.type) for f in struct_type
        ]
        values = pa.StructArray.from_arrays(children, fields=list(struct_type))
        offsets = np.searchsorted(ranks, np.arange(world + 1)).astype(np.int32)
        columns.append(pa.ListArray.from_arrays(pa.array(offsets), values))
    if other is None:  # `other`: one JSON line a rank (the simulator's meta records)
        columns.append(pa.ListArray.from_arrays(pa.array(np.zeros(world + 1, np.int32)),
                                                pa.array([], _STR)))  # fmt: skip
    else:
        offsets = np.arange(world + 1, dtype=np.int32)
        columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(other, _STR)))
    return pa.RecordBatch.from_arrays(columns, schema=STREAM_SCHEMA)


# --- reading -------------------------------------------------------------------------------------
@dataclass
class ArrowRank:
    """One Arrow rank file decoded: packed columns by kind (rank excluded), the JSON lines of
    records that fit no typed schema, notes, and how many step records have a NaN loss.
    `fatal`: the whole file is unusable (the note says why)."""

    columns: dict[str, dict[str, Packed]] = field(default_factory=dict)
    other_lines: list[bytes] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    nan_loss: int = 0
    fatal: bool = False


def decode(
    data: bytes,
    name: str,
    columns: Mapping[str, tuple[str, ...]],
    floats: Mapping[str, Iterable[str]],
) -> ArrowRank:
    """Decode one rank file's bytes into the loader's columns (`columns`: by kind, the names it
    keeps; `floats`: by kind, the numeric ones, NaN for null)."""
    batches, notes, error = _read_batches(data, name)
    if error is not None:
        return ArrowRank(skipped=[f"{name}: {error}"], fatal=True)
    return decoded(_combined(batches), notes, name, columns, floats)


def decoded(
    lists: Mapping[str, pa.ListArray],
    notes: list[str],
    name: str,
    columns: Mapping[str, tuple[str, ...]],
    floats: Mapping[str, Iterable[str]],
    encoded: Callable[[str, str], Encoded | None] | None = None,
    direct: Callable[[str], tuple[dict[str, Packed], int] | None] | None = None,
) -> ArrowRank:
    """`decode`'s output from every column's lists over the file's batches (one array a
    column, as `_combined` makes them) and the notes of reading them. `encoded(kind, name)`:
    a label field of every record of the file dictionary-encoded as `packed` would, or None
    (used when no record of the kind is rejected). `direct(kind)`: a kind's packed columns
    and NaN-loss count when no record of it is rejected, made without these arrays, or None."""
    out = ArrowRank(skipped=notes)
    rejected: Counter[str] = Counter()
    for kind in KIND_FIELDS:
        ready = direct(kind) if direct is not None else None
        if ready is not None:
            out.columns[kind], nan_loss = ready
            out.nan_loss = nan_loss if kind == "step" else out.nan_loss
            continue
        values = lists[kind].flatten()
        keep = usable(kind, values, _TYPED[kind], rejected)
        free: list[dict[str, Any]] = []
        if kind == "event":
            free, ok = event_fields(values.field(EXTRA), keep, rejected)
            keep &= ok
        whole = bool(keep.all())
        values = values if whole else values.filter(pa.array(keep))
        table: dict[str, Packed] = {}
        for col in columns[kind]:
            if col == "rank":
                continue
            if kind == "event" and col == "fields":
                table[col] = [f for f, k in zip(free, keep.tolist(), strict=True) if k]
            else:
                numeric = col in floats.get(kind, ())
                label = None
                if encoded is not None and whole and not numeric and col not in INT_COLUMNS:
                    label = encoded(kind, col)
                field = _field_or_nulls(values, kind, col)
                table[col] = label if label is not None else packed(field, col, numeric)
        if kind == "step" and len(values):
            out.nan_loss = int(pc.sum(pc.is_nan(values.field("loss"))).as_py() or 0)
        out.columns[kind] = table
    other = lists[OTHER].flatten()
    out.other_lines = [line.encode() for line in other.to_pylist() if line is not None]
    for i, (reason, count) in enumerate(rejected.items()):
        if i == MAX_NOTES_PER_FILE:
            out.skipped.append(f"{name}: {sum(list(rejected.values())[i:])} more records "
                               f"skipped ({len(rejected) - i} other reasons)")  # fmt: skip
            break
        out.skipped.append(f"{name}: {count} {'record' if count == 1 else 'records'} skipped "
                           f"({reason})")  # fmt: skip
    return out


def _combined(batches: list[pa.RecordBatch]) -> dict[str, pa.ListArray]:
    """Every column's lists over all batches, each as one array, in one call for the file.
    Concatenating costs about a microsecond per batch and child array whatever the rows, so
    a column whose lists hold no values in any batch (a kind the run never records) is not
    concatenated: it is left empty."""
    lists = {f.name: EMPTY_LISTS[f.name] for f in STREAM_SCHEMA}
    used = [name for name in lists if any(len(b.column(name).values) for b in batches)]
    if used:
        table = pa.Table.from_batches(batches).select(used).combine_chunks()
        lists.update((name, table.column(name).chunk(0)) for name in used)
    return lists


EMPTY_LISTS = {f.name: pa.array([], f.type) for f in STREAM_SCHEMA}
_TYPED = {kind: frozenset(n for n, _ in fields) for kind, fields in KIND_FIELDS.items()}


def records(data: bytes, name: str, notes: list[str]) -> Iterator[dict[str, Any]]:
    """Every record of a rank file as a dict (typed fields, then its `extra` fields), batch by
    batch, each batch's kinds in schema order then its JSON lines; what cannot be read is
    noted in `notes` (`diag convert`)."""
    batches, found, error = _read_batches(data, name)
    notes += found if error is None else [f"{name}: {error}"]
    for batch in batches:
        for kind in KIND_FIELDS:
            for row in _values([batch], kind).to_pylist():
                if row is None:
                    continue
                extra = row.pop(EXTRA)
                fields = _extra_object(extra) if extra is not None else {}
                if fields is None:
                    notes.append(f"{name}: a {kind} record's extra fields unreadable, dropped")
                    fields = {}
                yield {"kind": kind, **row, **fields}
        for line in batch.column(OTHER).flatten().to_pylist():
            value = _extra_object(line) if line is not None else None
            if value is not None:
                yield value


def _extra_object(text: str) -> dict[str, Any] | None:
    """A JSON object text within the line and depth bounds, or None."""
    try:
        value = json.loads(text) if len(text) <= MAX_LINE_BYTES else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or depth(value) > MAX_JSON_DEPTH:
        return None
    return value


def _read_batches(data: bytes, name: str) -> tuple[list[pa.RecordBatch], list[str], str | None]:
    """The stream's complete batches, a note when it ends in an incomplete or unreadable one,
    or the reason the whole file is unusable (no valid schema of this format)."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
    try:
        message = reader.read_next_message()
        if message.type != "schema":
            return [], [], "not an Arrow rank file (no schema message first)"
        stream_schema = pa.ipc.read_schema(message)
    except StopIteration:
        return [], [], "empty Arrow stream (no schema)"
    except (pa.ArrowException, OSError, ValueError):
        return [], [], "not an Arrow IPC stream (or its schema is cut short)"
    wrong = check_schema(stream_schema)
    if wrong is not None:
        return [], [], wrong
    batches: list[pa.RecordBatch] = []
    problem = None
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError):
            problem = "ends in an incomplete or unreadable message (a rank killed mid-write?)"
            break
        if message.type != "record batch":
            problem = f"holds a {message.type} message, not a record batch"
            break
        if is_compressed(message.metadata.to_pybytes()):
            problem = "holds a compressed record batch (this format writes none)"
            break
        try:
            batch = pa.ipc.read_record_batch(message, stream_schema)
            batch.validate(full=True)
        except (pa.ArrowException, OSError, ValueError):
            problem = "holds a corrupt record batch"
            break
        batches.append(_with_added_fields(batch))
    notes = []
    if problem is not None:
        plural = "batch" if len(batches) == 1 else "batches"
        notes.append(f"{name}: {problem}; read up to there ({len(batches)} complete {plural} "
                     "kept, the rest skipped)")  # fmt: skip
    return batches, notes, None


def _with_added_fields(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with the typed fields an older file lacks (ADDED_FIELDS) as null children; as
    it is where its struct cannot be rebuilt (a hostile file: field names that are not UTF-8),
    for the decode to judge as any other batch."""
    try:
        return _rebuilt_with_added_fields(batch)
    except (UnicodeDecodeError, pa.ArrowException, ValueError):
        return batch


def _rebuilt_with_added_fields(batch: pa.RecordBatch) -> pa.RecordBatch:
    columns, changed = [], False
    for name in batch.schema.names:
        column = batch.column(name)
        wanted = ADDED_FIELDS.get(name, frozenset())
        values = column.values if wanted else None
        missing = [f for f in KIND_FIELDS.get(name, ()) if f[0] in wanted
                   and values is not None and values.type.get_field_index(f[0]) < 0]  # fmt: skip
        if values is not None and missing:
            children = [values.field(i) for i in range(values.type.num_fields)]
            names = [values.type.field(i).name for i in range(values.type.num_fields)]
            children += [pa.nulls(len(values), kind) for _, kind in missing]
            names += [field_name for field_name, _ in missing]
            struct = pa.StructArray.from_arrays(children, names, mask=values.is_null())
            column = pa.ListArray.from_arrays(column.offsets, struct, mask=column.is_null())
            changed = True
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, batch.schema.names) if changed else batch


def check_schema(found: pa.Schema) -> str | None:
    """Why a stream's schema is not this format's, or None. Extra columns and extra struct
    fields are allowed (the format grows by extension); the typed ones must match."""
    meta = found.metadata or {}
    if meta.get(FORMAT_KEY) != FORMAT_VALUE:
        shown = meta.get(FORMAT_KEY, b"none")[:40].decode("utf-8", "replace")
        return f"not a diag Arrow rank file (format {shown!r}, expected {FORMAT_VALUE.decode()!r})"
    for expected in STREAM_SCHEMA:
        index = found.get_field_index(expected.name)
        if index < 0:
            return f"wrong schema: no column {expected.name!r}"
        got = found.field(index).type
        if not pa.types.is_list(got):
            return f"wrong schema: column {expected.name!r} is {got}, expected {expected.type}"
        if expected.name == OTHER:
            if got.value_type != _STR:
                return f"wrong schema: column {OTHER!r} is {got}, expected {expected.type}"
            continue
        if not pa.types.is_struct(got.value_type):
            return f"wrong schema: column {expected.name!r} is {got}, expected a list of structs"
        for child in expected.type.value_type:
            at = got.value_type.get_field_index(child.name)
            if at < 0 and child.name in ADDED_FIELDS.get(expected.name, ()):
                continue  # an older file: read as null (`_with_added_fields`)
            if at < 0 or got.value_type.field(at).type != child.type:
                return f"wrong schema: {expected.name}.{child.name} missing or not {child.type}"
    return None


def _values(batches: list[pa.RecordBatch], kind: str) -> pa.StructArray:
    """A kind's records over every batch, as one struct array of the typed fields."""
    wanted = kind_type(kind)
    if not batches:
        return pa.array([], type=wanted)
    lists = [batch.column(kind) for batch in batches]
    values = (pa.concat_arrays(lists) if len(lists) > 1 else lists[0]).flatten()
    children = [_field_or_nulls(values, kind, f.name) for f in wanted]
    mask = values.is_null() if values.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(wanted), mask=mask)


def _field_or_nulls(values: pa.StructArray, kind: str, name: str) -> pa.Array:
    """The field `name` of a kind's records, or nulls of its type where a batch lacks it (a
    field added since, ADDED_FIELDS, in a file whose struct could not be completed)."""
    if values.type.get_field_index(name) >= 0:
        return values.field(name)
    wanted = kind_type(kind)
    index = wanted.get_field_index(name)
    return pa.nulls(len(values), wanted.field(index).type if index >= 0 else pa.null())
