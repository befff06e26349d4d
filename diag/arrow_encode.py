"""One collector flush as one Arrow IPC message, assembled from its buffers (the collectors'
writer, collectors/writer.py): the same bytes as `arrow_format.encode_batch`, at a fraction of
its cost (benchmarks/flush_cost.py).

`encode_batch` hands Arrow one list of dicts per record kind, and Arrow's conversion of nested
Python objects costs tens of microseconds a kind. A flush's batch is always one row of the
stream's fixed schema, so its metadata (the Message and RecordBatch flatbuffers) has the same
layout in every flush: only the node lengths and null counts, the buffer offsets and lengths,
and the body length change. This module takes that metadata from one batch Arrow serialised
(a template, built at import) and writes each flush's numbers into a copy of it; the body is
the buffers in the order the IPC format lays them out (a field's validity bitmap, then its
offsets and data; children after parents; each padded to 8 bytes; a bitmap only where a field
has nulls), packed with `struct` from columns of Python values.

Which records go typed and which travel as JSON in `other` is decided as `encode_batch`
decides it (tests/unit/test_arrow_encode.py holds the two to the same bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate, chain
from typing import Any

import pyarrow as pa

from diag import arrow_format as af

_PAD = 8
_INT64_MIN, _INT64_MAX = -(2**63), 2**63
_Column = tuple[Any, ...]
_Buffers = list[bytes | None]
"""A field's buffers in IPC order; None: an absent validity bitmap (no nulls)."""
_Nodes = list[tuple[int, int]]


def _bitmap(values: _Column) -> bytes:
    bits = bytearray((len(values) + 7) // 8)
    for i, value in enumerate(values):
        if value is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return bytes(bits)


def _fixed(code: str, zero: Any) -> Callable[[_Column, _Nodes, _Buffers], None]:
    def encode(values: _Column, nodes: _Nodes, buffers: _Buffers) -> None:
        nulls = values.count(None)
        if nulls:
            buffers.append(_bitmap(values))
            values = tuple(zero if v is None else v for v in values)
        else:
            buffers.append(None)
        nodes.append((len(values), nulls))
        buffers.append(struct.pack(f"<{len(values)}{code}", *values))

    return encode


def _offsets(lengths: Iterable[int]) -> bytes:
    ends = list(accumulate(lengths, initial=0))
    return struct.pack(f"<{len(ends)}i", *ends)


def _string(values: _Column, nodes: _Nodes, buffers: _Buffers) -> None:
    nulls = values.count(None)
    buffers.append(_bitmap(values) if nulls else None)
    nodes.append((len(values), nulls))
    data = [b"" if v is None else v.encode() for v in values]
    buffers.append(_offsets(map(len, data)))
    buffers.append(b"".join(data))


def _bools(values: _Column, nodes: _Nodes, buffers: _Buffers) -> None:
    nulls = values.count(None)
    buffers.append(_bitmap(values) if nulls else None)
    nodes.append((len(values), nulls))
    buffers.append(_bitmap(tuple(True if v else None for v in values)))


def _float_lists(values: _Column, nodes: _Nodes, buffers: _Buffers) -> None:
    nulls = values.count(None)
    buffers.append(_bitmap(values) if nulls else None)
    nodes.append((len(values), nulls))
    lists = [() if v is None else v for v in values]
    buffers.append(_offsets(map(len, lists)))
    flat = [x for v in lists for x in v]
    nodes.append((len(flat), 0))
    buffers += [None, struct.pack(f"<{len(flat)}d", *flat)]


_I64, _F64, _STR, _BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()
_FLOAT_LIST = pa.list_(_F64)
_ENCODERS = {
    _I64: _fixed("q", 0),
    _F64: _fixed("d", 0.0),
    _STR: _string,
    _BOOL: _bools,
    _FLOAT_LIST: _float_lists,
}
_KINDS = tuple(af.KIND_FIELDS)
_COLUMNS = {
    kind: (*(_ENCODERS[t] for _, t in fields), _string)  # the typed fields, then `extra`
    for kind, fields in af.KIND_FIELDS.items()
}
_NAMES = {kind: tuple(n for n, _ in fields) for kind, fields in af.KIND_FIELDS.items()}
_REQUIRED = {kind: tuple(af.schema.REQUIRED_FIELDS.get(kind, ())) for kind in _KINDS}
_NOT_NULL = {kind: tuple(n for n in _NAMES[kind] if n in af.NOT_NULL) for kind in _KINDS}
_TYPED_KEYS = {kind: frozenset((*_NAMES[kind], "kind")) for kind in _KINDS}


_INT_TYPES = frozenset({int, type(None)})
_ACCEPTED: dict[pa.DataType, frozenset[type]] = {
    _I64: _INT_TYPES,
    _F64: frozenset({int, float, type(None)}),
    _STR: frozenset({str, type(None)}),
    _BOOL: frozenset({bool, type(None)}),
    _FLOAT_LIST: frozenset({list, type(None)}),
}
_SIGNATURES: dict[str, dict[tuple[type, ...], bool]] = {kind: {} for kind in _KINDS}
"""By kind: whether a tuple of the typed fields' Python types fits the schema (a collector's
records have the same few signatures every flush: one lookup a record)."""
_INTS = {
    kind: tuple(i for i, (_, t) in enumerate(f) if t == _I64) for kind, f in af.KIND_FIELDS.items()
}
_LISTS = {kind: tuple(i for i, (_, t) in enumerate(f) if t == _FLOAT_LIST)
          for kind, f in af.KIND_FIELDS.items()}  # fmt: skip


def _signature_fits(kind: str, types: tuple[type, ...]) -> bool:
    fits = all(t in _ACCEPTED[f] for t, (_, f) in zip(types, af.KIND_FIELDS[kind], strict=True))
    if len(_SIGNATURES[kind]) < 1024:  # bounded: a hostile caller cannot grow it forever
        _SIGNATURES[kind][types] = fits
    return fits


def _typed_row(record: Mapping[str, Any], kind: str) -> tuple[Any, ...] | None:
    """The record's typed values and its `extra` JSON (None when none), or None when it fits
    no typed schema (arrow_format.encode_batch's test, field for field)."""
    for name in _REQUIRED[kind]:
        if name not in record:
            return None
    get = record.get
    names = _NAMES[kind]
    values = [get(name) for name in names]
    types = tuple(map(type, values))
    fits = _SIGNATURES[kind].get(types)
    if fits is None:
        fits = _signature_fits(kind, types)
    if not fits:
        return None
    for name in _NOT_NULL[kind]:
        if get(name) is None:
            return None
    for i in _INTS[kind]:
        value = values[i]
        if value is not None and not _INT64_MIN <= value < _INT64_MAX:
            return None
    for i in _LISTS[kind]:
        value = values[i]
        if value is not None and not all(type(x) is float or type(x) is int for x in value):
            return None
    extra = record.keys() - _TYPED_KEYS[kind]
    if extra:  # in the record's order, as encode_batch writes them
        values.append(af._json({k: v for k, v in record.items() if k in extra}))
    else:
        values.append(None)
    return tuple(values)


# --- the template: the metadata of a batch of this schema, as Arrow writes it ----------------
def _template() -> tuple[bytes, int, int, int, int]:
    """The encapsulated message's prefix and metadata of a reference batch, and where in the
    metadata the body length, the nodes and the buffers are, and how many buffers."""
    sample = af.encode_batch([])
    size = struct.unpack_from("<i", sample, 4)[0]
    metadata = sample[8 : 8 + size]
    message = af._table(metadata, struct.unpack_from("<I", metadata, 0)[0])
    body_at = af._field_offset(metadata, message, 3)
    header_at = af._field_offset(metadata, message, 2)
    assert body_at is not None and header_at is not None, "Arrow wrote no body length"
    header = header_at + struct.unpack_from("<I", metadata, header_at)[0]
    batch = af._table(metadata, header)
    vectors = []
    for index in (1, 2):  # RecordBatch.nodes, RecordBatch.buffers
        at = af._field_offset(metadata, batch, index)
        assert at is not None
        start = at + struct.unpack_from("<I", metadata, at)[0]
        vectors.append((start + 4, struct.unpack_from("<I", metadata, start)[0]))
    (nodes_at, _), (buffers_at, count) = vectors
    return sample[:8] + metadata, body_at + 8, nodes_at + 8, buffers_at + 8, count


_PREFIX_AND_METADATA, _BODY_AT, _NODES_AT, _BUFFERS_AT, _BUFFER_COUNT = _template()


def _kind_section(kind: str, rows: list[tuple[Any, ...]]) -> tuple[_Nodes, _Buffers]:
    count = len(rows)
    nodes: _Nodes = [(1, 0), (count, 0)]  # the list (one row) and its struct
    buffers: _Buffers = [None, struct.pack("<2i", 0, count), None]
    columns = zip(*rows, strict=True) if count else ((),) * len(_COLUMNS[kind])
    for encode, values in zip(_COLUMNS[kind], columns, strict=True):
        encode(values, nodes, buffers)
    return nodes, buffers


_EMPTY = {kind: _kind_section(kind, []) for kind in _KINDS}
_PADDING = [bytes(-n % _PAD) for n in range(_PAD)]


def encode_flush(records: Iterable[Mapping[str, Any]]) -> bytes:
    """One flush's records as one encapsulated IPC message: `arrow_format.encode_batch`'s."""
    rows: dict[str, list[tuple[Any, ...]]] = {kind: [] for kind in _KINDS}
    other: list[str] = []
    for record in records:
        kind = record.get("kind")
        if isinstance(kind, str) and kind in rows:
            row = _typed_row(record, kind)
            if row is not None:
                rows[kind].append(row)
                continue
        other.append(af._json(record))
    nodes: _Nodes = []
    buffers: _Buffers = []
    for kind in _KINDS:
        kind_nodes, kind_buffers = _kind_section(kind, rows[kind]) if rows[kind] else _EMPTY[kind]
        nodes += kind_nodes
        buffers += kind_buffers
    nodes.append((1, 0))
    buffers += [None, struct.pack("<2i", 0, len(other))]
    _string(tuple(other), nodes, buffers)
    return _assemble(nodes, buffers)


def _assemble(nodes: _Nodes, buffers: _Buffers) -> bytes:
    """The template's metadata with these nodes and buffers, then the body."""
    message = bytearray(_PREFIX_AND_METADATA)
    struct.pack_into(f"<{2 * len(nodes)}q", message, _NODES_AT, *chain.from_iterable(nodes))
    if len(buffers) != _BUFFER_COUNT:
        raise AssertionError(f"{len(buffers)} buffers for a schema of {_BUFFER_COUNT}")
    data = [b"" if b is None else b for b in buffers]
    sizes = list(map(len, data))
    pads = [_PADDING[n % _PAD] for n in sizes]
    offsets = list(accumulate(map(len, chain.from_iterable(zip(data, pads, strict=True)))))
    starts = [0, *offsets[1::2]]  # each buffer starts after the previous one's padding
    struct.pack_into(f"<{2 * len(sizes)}q", message, _BUFFERS_AT,
                     *chain.from_iterable(zip(starts, sizes, strict=False)))  # fmt: skip
    struct.pack_into("<q", message, _BODY_AT, offsets[-1])
    return b"".join((message, *chain.from_iterable(zip(data, pads, strict=True))))
