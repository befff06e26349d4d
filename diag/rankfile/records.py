"""Typed decoding of a rank file: the fast path of `diag.read.load`.

A rank file whose every line is a well-formed record of a known kind is decoded in one msgspec
call into slotted structs, checked for the few constraints types cannot say (t1 before t0), and
turned into columns. Anything else (a truncated line, NaN, a float time, a wrong type, a record
kind this version does not know) makes `decode_rank_file` return None, and the loader reads
that file line by line with the standard parser, which names every problem. Both paths give the
same tables; the fast one is several times quicker and holds no per-record dicts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from itertools import compress
from typing import Annotated, Any, NamedTuple

import msgspec
import numpy as np
from msgspec.structs import astuple

from diag.contract.limits import MAX_ABS_TIME_NS, MAX_EXPERTS, MAX_INDEX, MAX_LABEL_CHARS, MAX_STEP
from diag.contract.schema import RecordKind

StepIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_STEP)]
TimeNs = Annotated[int, msgspec.Meta(gt=-MAX_ABS_TIME_NS, lt=MAX_ABS_TIME_NS)]
Index = Annotated[int, msgspec.Meta(ge=0, lt=MAX_INDEX)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_LABEL_CHARS)]
Column = np.ndarray | list[Any] | tuple[Any, ...]
Label = Text | Index | None
"""What the analysis groups by (phase, op, group, tag, layer, name): a string, an int or null,
within the bounds of diag/contract/limits.py (what the line-by-line path checks,
diag/rankfile/record_checks.py)."""


class _Record(msgspec.Struct, tag_field="kind"):
    pass


class MetaRecord(_Record, tag="meta"):
    """The first line of a rank file (collectors/recorder.py); the loader needs none of it."""


class StepRecord(_Record, tag=RecordKind.STEP.value):
    step: StepIndex
    t0: TimeNs
    t1: TimeNs
    tokens: float | None = None
    loss: float | None = None
    cpu_ns: int | None = None  # the host's share of the step (collectors/host.py)
    runq_ns: int | None = None
    nivcsw: int | None = None
    load1: float | None = None
    proc_cpu_ns: int | None = None
    proc_runq_ns: int | None = None


class SpanRecord(_Record, tag=RecordKind.SPAN.value):
    step: StepIndex
    phase: Label
    t0: TimeNs
    t1: TimeNs
    mb: Index | None = None
    stage: Index | None = None
    chunk: Index | None = None


class CommRecord(_Record, tag=RecordKind.COMM.value):
    step: StepIndex
    op: Label
    group: Label
    group_size: float | None
    bytes: float | None
    t0: TimeNs
    t1: TimeNs
    dtype: Label = None
    expected_bytes: float | None = None
    tag: Label = None
    is_async: bool | None = msgspec.field(default=None, name="async")
    blocking: bool | None = None


class MemRecord(_Record, tag=RecordKind.MEM.value):
    step: StepIndex
    params: float | None
    grads: float | None
    optimizer: float | None
    activations: float | None
    comm_buffers: float | None
    fragmentation: float | None
    device_peak: float | None = None
    host_rss: float | None = None
    source: Label = None


class ExpertsRecord(_Record, tag=RecordKind.EXPERTS.value):
    step: StepIndex
    layer: Label
    tokens: Annotated[list[float], msgspec.Meta(max_length=MAX_EXPERTS)]
    dropped: float | None = None
    capacity: float | None = None
    aux_loss: float | None = None


class EventRecord(_Record, tag=RecordKind.EVENT.value):
    """Only the kind is typed: events keep free fields, re-read from their line."""

    step: StepIndex
    name: Label


AnyRecord = (
    MetaRecord | StepRecord | SpanRecord | CommRecord | MemRecord | ExpertsRecord | EventRecord
)
_DECODER = msgspec.json.Decoder(list[AnyRecord])
_STRUCTS: dict[str, type[_Record]] = {
    RecordKind.STEP.value: StepRecord,
    RecordKind.SPAN.value: SpanRecord,
    RecordKind.COMM.value: CommRecord,
    RecordKind.MEM.value: MemRecord,
    RecordKind.EXPERTS.value: ExpertsRecord,
}
_ATTRIBUTE = {"async": "is_async"}
_TIMED = (StepRecord, SpanRecord, CommRecord)


class Decoded(msgspec.Struct):
    """One rank file's records as columns by kind (column name -> values, rank excluded), the
    event lines (decoded by the caller, free fields and all) and how many records were
    dropped for t1 before t0, by kind."""

    columns: dict[str, dict[str, Column]]
    event_lines: list[bytes]
    reversed_times: dict[str, int]


def decode_rank_file(data: bytes, columns: dict[str, tuple[str, ...]]) -> Decoded | None:
    """Decode a whole rank file; None when any line needs the line-by-line path."""
    body = data.strip()
    if b"\n\n" in body:  # blank lines: join the others
        body = b",".join(line for line in body.split(b"\n") if line.strip())
    else:
        body = body.replace(b"\n", b",")
    try:
        records = _DECODER.decode(b"[" + body + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    by_type: dict[type[_Record], list[Any]] = defaultdict(list)
    for record in records:
        by_type[type(record)].append(record)
    event_lines = []
    if by_type[EventRecord]:
        lines = [line for line in data.split(b"\n") if line.strip()]
        event_lines = [lines[i] for i, r in enumerate(records) if type(r) is EventRecord]
    reversed_times: dict[str, int] = {}
    out: dict[str, dict[str, Column]] = {}
    for kind, cls in _STRUCTS.items():
        fields = cls.__struct_fields__
        transposed = list(zip(*map(astuple, by_type[cls]), strict=True)) or [()] * len(fields)
        by_field = dict(zip(fields, transposed, strict=True))
        if cls in _TIMED:
            kept = np.asarray(by_field["t1"]) >= np.asarray(by_field["t0"])
            if not kept.all():
                reversed_times[kind] = int((~kept).sum())
                by_field = {k: tuple(compress(v, kept)) for k, v in by_field.items()}
        out[kind] = {
            name: by_field[_ATTRIBUTE.get(name, name)] for name in columns[kind] if name != "rank"
        }
    return Decoded(out, event_lines, reversed_times)


INT_COLUMNS = frozenset({"rank", "step", "t0", "t1"})
"""Integers in every table, on both paths (the line-by-line path converts them)."""


class Encoded(NamedTuple):
    """A column of repeated labels as its distinct values and one code per row."""

    values: list[Any]
    codes: np.ndarray


Packed = np.ndarray | Encoded | list[Any]


def pack(
    columns: dict[str, dict[str, Column]], floats: Mapping[str, Collection[str]] | None = None
) -> dict[str, dict[str, Packed]]:
    """Columns in a form that crosses a process boundary cheaply: integer columns as int64
    arrays, `floats` (by kind, the columns known to hold only numbers or null) as float64
    arrays with NaN,
    repeated hashable labels dictionary-encoded, anything else (lists, dicts) as is."""
    return {
        kind: {
            name: _pack_column(name, values, (floats or {}).get(kind, ()))
            for name, values in table.items()
        }
        for kind, table in columns.items()
    }


def _pack_column(name: str, values: Column, floats: Collection[str]) -> Packed:
    if name in INT_COLUMNS:
        return np.asarray(values, dtype=np.int64)
    if name in floats:
        return np.asarray(values, dtype=np.float64)  # None -> NaN
    try:
        distinct = dict.fromkeys(values)
    except TypeError:  # unhashable: lists of tokens, event fields
        return list(values)
    if len(distinct) > len(values) // 2:
        return list(values)
    code = {value: i for i, value in enumerate(distinct)}
    codes = np.fromiter(map(code.__getitem__, values), np.int32, count=len(values))
    return Encoded(list(distinct), codes)


def take(values: Packed, keep: np.ndarray) -> Packed:
    """The rows of a packed column where `keep` (a boolean array) is true."""
    if isinstance(values, Encoded):
        return Encoded(values.values, values.codes[keep])
    if isinstance(values, np.ndarray):
        return values[keep]
    return list(compress(values, keep))


def concat(parts: list[Packed]) -> Packed:
    """Packed parts as one packed column: arrays concatenated, dictionary-encoded labels under
    one merged dictionary, anything else as one list."""
    arrays = [p for p in parts if isinstance(p, np.ndarray)]
    if parts and len(arrays) == len(parts):
        return np.concatenate(arrays)
    encoded = [p for p in parts if isinstance(p, Encoded)]
    if parts and len(encoded) == len(parts):
        merged: dict[Any, int] = {}
        codes = [
            np.fromiter((merged.setdefault(v, len(merged)) for v in p.values), np.int32)[p.codes]
            for p in encoded
        ]
        return Encoded(list(merged), np.concatenate(codes))
    return list(unpack(parts))


def unpack(parts: list[Packed]) -> Column:
    """One column from every file's packed part, in order. Arrays are concatenated; labels
    that every part dictionary-encoded are decoded in one vectorised lookup into the array
    pandas would infer from their values; anything else becomes a list (pandas infers)."""
    if parts and all(isinstance(p, np.ndarray) for p in parts):
        arrays = [p for p in parts if isinstance(p, np.ndarray)]
        return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
    if parts and all(isinstance(p, Encoded) for p in parts):
        return _decode_labels([p for p in parts if isinstance(p, Encoded)])
    out: list[Any] = []
    for part in parts:
        if isinstance(part, Encoded):
            out += map(part.values.__getitem__, part.codes.tolist())
        elif isinstance(part, np.ndarray):
            out += part.tolist()
        else:
            out += part
    return out


def _decode_labels(parts: list[Encoded]) -> np.ndarray:
    """Merge the parts' dictionaries, then look every code up at once."""
    merged: dict[Any, int] = {}
    codes = []
    for part in parts:
        remap = np.fromiter(
            (merged.setdefault(v, len(merged)) for v in part.values), np.int64, len(part.values)
        )
        codes.append(remap[part.codes])
    table = label_array(list(merged))
    return table[np.concatenate(codes)]


def label_array(values: list[Any]) -> np.ndarray:
    """The distinct values as the array pandas would infer from a list holding them: ints
    (float with NaN when null is among them), floats, bools without nulls; objects
    otherwise (strings become pandas' str dtype from there, as from a list)."""
    present = [v for v in values if v is not None]
    has_null = len(present) < len(values)
    kinds = {type(v) for v in present}
    if kinds == {int}:
        return np.array(values, dtype=np.float64 if has_null else np.int64)
    if kinds and kinds <= {int, float}:
        return np.array(values, dtype=np.float64)
    if kinds == {bool} and not has_null:
        return np.array(values, dtype=bool)
    table = np.empty(len(values), dtype=object)
    table[:] = values
    return table
