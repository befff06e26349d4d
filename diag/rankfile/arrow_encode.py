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
has nulls), packed with `struct` from columns of Python values: a kind's adjacent integer and
float fields with no nulls in one call, a field of nulls only (most `extra` columns) from
prebuilt bytes. A flush whose integers overflow int64 (a record that belongs in `other`) is
rare: it is handed to `encode_batch` whole.

Which records go typed and which travel as JSON in `other` is decided as `encode_batch`
decides it (tests/unit/test_arrow_encode.py holds the two to the same bytes).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Mapping
from itertools import accumulate, chain
from typing import Any

import pyarrow as pa

from diag.rankfile import arrow_format as af
from diag.rankfile.arrow_messages import flatbuffer_field, flatbuffer_table

_PAD = 8
_MAX_CACHED = 4096
"""Entries at most in each cache below (sizes of columns, type signatures): a caller cannot
grow them without bound."""
_Column = tuple[Any, ...]


class _Body:
    """The batch being built: each field node's (length, null count), each buffer's size in
    IPC order (0: absent), and the body's bytes (each buffer padded to 8 bytes)."""

    __slots__ = ("body", "nodes", "sizes")

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.sizes: list[int] = []
        self.body: list[bytes] = []

    def add(self, data: bytes) -> None:
        self.sizes.append(len(data))
        self.body.append(data)
        if len(data) % _PAD:
            self.body.append(_PADDING[len(data) % _PAD])

    def validity(self, values: _Column) -> int:
        """The node and validity bitmap of a field; its null count."""
        nulls = values.count(None)
        self.nodes += (len(values), nulls)
        if nulls:
            self.add(_bitmap(values))
        else:
            self.sizes.append(0)
        return nulls


_PADDING = [bytes(-n % _PAD) for n in range(_PAD)]


def _bitmap(values: _Column) -> bytes:
    bits = bytearray((len(values) + 7) // 8)
    for i, value in enumerate(values):
        if value is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return bytes(bits)


def _offsets(lengths: Iterable[int]) -> bytes:
    ends = list(accumulate(lengths, initial=0))
    return struct.pack(f"<{len(ends)}i", *ends)


def _fixed(out: _Body, values: _Column, code: str) -> None:
    if out.validity(values):
        values = tuple(0 if v is None else v for v in values)
    out.add(struct.pack(f"<{len(values)}{code}", *values))


_NULL_STRINGS: dict[int, tuple[tuple[int, ...], bytes]] = {}


_LABELS: dict[_Column, tuple[tuple[int, ...], tuple[int, ...], bytes]] = {}
"""String columns by their values: the labels of a collector's records (phases, ops, groups,
tags) repeat every flush. Columns up to _MAX_LABELS_BYTES encoded are kept."""
_MAX_LABELS_BYTES = 1024


def _label_column(out: _Body, values: _Column) -> None:
    """A string column of labels, from its cached encoding when it was seen before."""
    entry = _LABELS.get(values)
    if entry is None:
        part = _Body()
        _string(part, values)
        entry = tuple(part.nodes), tuple(part.sizes), b"".join(part.body)
        if len(_LABELS) < _MAX_CACHED and len(entry[2]) <= _MAX_LABELS_BYTES:
            _LABELS[values] = entry
    out.nodes += entry[0]
    out.sizes += entry[1]
    out.body.append(entry[2])


def _string(out: _Body, values: _Column) -> None:
    count = len(values)
    nulls = values.count(None)
    if nulls == count:  # all null (an `extra` column of records without free fields)
        sizes, data = _NULL_STRINGS.get(count) or _null_strings(count)
        out.nodes += (count, count)
        out.sizes += sizes
        out.body.append(data)
        return
    out.validity(values)
    texts = [v or "" for v in values] if nulls else values
    joined = "".join(texts)
    if joined.isascii():
        out.add(_offsets(map(len, texts)))
        out.add(joined.encode())
    else:
        encoded = [t.encode() for t in texts]
        out.add(_offsets(map(len, encoded)))
        out.add(b"".join(encoded))


def _null_strings(count: int) -> tuple[tuple[int, ...], bytes]:
    part = _Body()
    part.add(bytes((count + 7) // 8))
    part.add(bytes(4 * (count + 1)))
    part.add(b"")
    entry = tuple(part.sizes), b"".join(part.body)
    if len(_NULL_STRINGS) < _MAX_CACHED:
        _NULL_STRINGS[count] = entry
    return entry


def _bools(out: _Body, values: _Column) -> None:
    out.validity(values)
    out.add(_bitmap(tuple(True if v else None for v in values)))


def _float_lists(out: _Body, values: _Column) -> None:
    out.validity(values)
    lists = [() if v is None else v for v in values]
    out.add(_offsets(map(len, lists)))
    flat = [x for v in lists for x in v]
    out.nodes += (len(flat), 0)
    out.sizes.append(0)
    out.add(struct.pack(f"<{len(flat)}d", *flat))


_I64, _F64, _STR, _BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()
_FLOAT_LIST = pa.list_(_F64)
_CODES = {_I64: "q", _F64: "d"}
_KINDS = tuple(af.KIND_FIELDS)
_NAMES = {kind: tuple(n for n, _ in fields) for kind, fields in af.KIND_FIELDS.items()}
_TYPED_KEYS = {kind: frozenset((*_NAMES[kind], "kind")) for kind in _KINDS}
_REQUIRED = {kind: frozenset(af.schema.REQUIRED_FIELDS.get(kind, ())) for kind in _KINDS}
_LISTS = {kind: tuple(i for i, (_, t) in enumerate(f) if t == _FLOAT_LIST)
          for kind, f in af.KIND_FIELDS.items()}  # fmt: skip


def _plan(kind: str) -> list[tuple[str, tuple[int, ...]]]:
    """A kind's fields (then `extra`) in groups: runs of adjacent integer and float fields
    ("fixed", their codes), and every other field on its own."""
    groups: list[tuple[str, tuple[int, ...]]] = []
    for i, (_, kind_of) in enumerate((*af.KIND_FIELDS[kind], (af.EXTRA, _STR))):
        code = _CODES.get(kind_of)
        if code is not None and groups and groups[-1][0][0] in "qd":
            codes, indices = groups[-1]
            groups[-1] = (codes + code, (*indices, i))
        elif code is not None:
            groups.append((code, (i,)))
        else:
            groups.append(({_STR: "s", _BOOL: "b", _FLOAT_LIST: "l"}[kind_of], (i,)))
    return groups


_PLANS = {kind: _plan(kind) for kind in _KINDS}
_OTHERS = {"s": _label_column, "b": _bools, "l": _float_lists}
_FIXED: dict[tuple[str, int], tuple[struct.Struct, tuple[int, ...], tuple[int, ...]]] = {}


def _fixed_run(codes: str, count: int) -> tuple[struct.Struct, tuple[int, ...], tuple[int, ...]]:
    """The packer of `count` rows of a run of fixed-width fields, and its nodes and sizes."""
    entry = _FIXED.get((codes, count))
    if entry is None:
        packer = struct.Struct("<" + "".join(f"{count}{code}" for code in codes))
        entry = packer, (count, 0) * len(codes), (0, 8 * count) * len(codes)
        if len(_FIXED) < _MAX_CACHED:
            _FIXED[codes, count] = entry
    return entry


def _fixed_columns(
    out: _Body, codes: str, columns: list[_Column], indices: tuple[int, ...], count: int
) -> None:
    """Adjacent fixed-width columns without nulls, in one `pack` (8-byte values: aligned)."""
    if codes:
        packer, nodes, sizes = _fixed_run(codes, count)
        out.nodes += nodes
        out.sizes += sizes
        out.body.append(packer.pack(*chain.from_iterable(columns[i] for i in indices)))


def _kind_section(out: _Body, kind: str, rows: list[tuple[Any, ...]]) -> None:
    count = len(rows)
    out.nodes += (1, 0, count, 0)  # the list (one row) and its struct
    out.sizes.append(0)
    out.add(struct.pack("<2i", 0, count))
    out.sizes.append(0)
    columns = list(zip(*rows, strict=True)) if count else [()] * (len(_NAMES[kind]) + 1)
    for codes, indices in _PLANS[kind]:
        if codes[0] in "qd":
            start = 0  # the columns without nulls from `start` on, packed in one call
            for at, i in enumerate(indices):
                if None in columns[i]:
                    _fixed_columns(out, codes[start:at], columns, indices[start:at], count)
                    _fixed(out, columns[i], codes[at])
                    start = at + 1
            _fixed_columns(out, codes[start:], columns, indices[start:], count)
        else:
            _OTHERS[codes](out, columns[indices[0]])


_SIGNATURES: dict[str, dict[tuple[type, ...], bool]] = {kind: {} for kind in _KINDS}
"""By kind: whether a tuple of the typed fields' Python types fits the schema (a collector's
records have the same few signatures every flush: one lookup a record)."""
_NONE = type(None)
_ACCEPTED = {
    _I64: frozenset({int, _NONE}),
    _F64: frozenset({int, float, _NONE}),
    _STR: frozenset({str, _NONE}),
    _BOOL: frozenset({bool, _NONE}),
    _FLOAT_LIST: frozenset({list, _NONE}),
}


def _signature_fits(kind: str, types: tuple[type, ...]) -> bool:
    """arrow_format._fits for each typed field (but the int64 range, checked when packed),
    and no null where the schema has none."""
    fits = all(
        t in _ACCEPTED[kind_of] and not (t is _NONE and name in af.NOT_NULL)
        for t, (name, kind_of) in zip(types, af.KIND_FIELDS[kind], strict=True)
    )
    if len(_SIGNATURES[kind]) < _MAX_CACHED:
        _SIGNATURES[kind][types] = fits
    return fits


def _typed_row(record: Mapping[str, Any], kind: str) -> tuple[Any, ...] | None:
    """The record's typed values and its `extra` JSON (None when none), or None when it fits
    no typed schema (arrow_format.encode_batch's test, field for field)."""
    if not _REQUIRED[kind] <= record.keys():
        return None
    values = list(map(record.get, _NAMES[kind]))
    types = tuple(map(type, values))
    fits = _SIGNATURES[kind].get(types)
    if not (_signature_fits(kind, types) if fits is None else fits):
        return None
    for i in _LISTS[kind]:
        value = values[i]
        if value is not None and not all(type(x) is float or type(x) is int for x in value):
            return None
    extra = record.keys() - _TYPED_KEYS[kind]
    # the free fields in the record's order, as encode_batch writes them
    values.append(af.json_text({k: v for k, v in record.items() if k in extra}) if extra else None)
    return tuple(values)


# --- the template: the metadata of a batch of this schema, as Arrow writes it ----------------
def _template() -> tuple[bytes, int, int, int, int]:
    """The encapsulated message's prefix and metadata of a reference batch, and where in the
    metadata the body length, the nodes and the buffers are, and how many buffers."""
    sample = af.encode_batch([])
    size = struct.unpack_from("<i", sample, 4)[0]
    metadata = sample[8 : 8 + size]
    message = flatbuffer_table(metadata, struct.unpack_from("<I", metadata, 0)[0])
    body_at = flatbuffer_field(metadata, message, 3)
    header_at = flatbuffer_field(metadata, message, 2)
    assert body_at is not None and header_at is not None, "Arrow wrote no body length"
    header = header_at + struct.unpack_from("<I", metadata, header_at)[0]
    batch = flatbuffer_table(metadata, header)
    vectors = []
    for index in (1, 2):  # RecordBatch.nodes, RecordBatch.buffers
        at = flatbuffer_field(metadata, batch, index)
        assert at is not None
        start = at + struct.unpack_from("<I", metadata, at)[0]
        vectors.append((start + 4, struct.unpack_from("<I", metadata, start)[0]))
    (nodes_at, _), (buffers_at, count) = vectors
    return sample[:8] + metadata, body_at + 8, nodes_at + 8, buffers_at + 8, count


PREFIX_AND_METADATA, BODY_AT, NODES_AT, BUFFERS_AT, BUFFER_COUNT = _template()
if sys.byteorder != "little" or array("q").itemsize != 8:  # the IPC format is little-endian
    raise ImportError("diag.rankfile.arrow_encode writes little-endian int64 with array('q')")


def encode_flush(records: Iterable[Mapping[str, Any]]) -> bytes:
    """One flush's records as one encapsulated IPC message: `arrow_format.encode_batch`'s."""
    records = records if isinstance(records, list) else list(records)
    rows: dict[str, list[tuple[Any, ...]]] = {kind: [] for kind in _KINDS}
    other: list[str] = []
    for record in records:
        kind = record.get("kind")
        if isinstance(kind, str) and kind in rows:
            row = _typed_row(record, kind)
            if row is not None:
                rows[kind].append(row)
                continue
        other.append(af.json_text(record))
    out = _Body()
    try:
        for kind in _KINDS:
            if rows[kind]:
                _kind_section(out, kind, rows[kind])
            else:
                out.nodes += _EMPTY[kind].nodes
                out.sizes += _EMPTY[kind].sizes
                out.body += _EMPTY[kind].body
    except (struct.error, OverflowError):  # an integer beyond int64: it travels in `other`
        return af.encode_batch(records)
    out.nodes += (1, 0)
    out.sizes.append(0)
    out.add(struct.pack("<2i", 0, len(other)))
    _string(out, tuple(other))
    return _assemble(out)


def _empty(kind: str) -> _Body:
    out = _Body()
    _kind_section(out, kind, [])
    return out


_EMPTY = {kind: _empty(kind) for kind in _KINDS}


_METADATA: dict[tuple[tuple[int, ...], tuple[int, ...]], bytes] = {}
"""The message prefix and metadata by (nodes, buffer sizes): a collector's flushes repeat a
few shapes (the same records a step, their labels alike), so most flushes look theirs up."""


def _assemble(out: _Body) -> bytes:
    """The template's metadata with this batch's nodes and buffers, then the body."""
    key = tuple(out.nodes), tuple(out.sizes)
    metadata = _METADATA.get(key)
    if metadata is None:
        metadata = _metadata(out)
        if len(_METADATA) < _MAX_CACHED:
            _METADATA[key] = metadata
    out.body.insert(0, metadata)
    return b"".join(out.body)


def _metadata(out: _Body) -> bytes:
    if len(out.sizes) != BUFFER_COUNT:
        raise AssertionError(f"{len(out.sizes)} buffers for a schema of {BUFFER_COUNT}")
    message = bytearray(PREFIX_AND_METADATA)
    nodes = array("q", out.nodes).tobytes()
    message[NODES_AT : NODES_AT + len(nodes)] = nodes
    starts = list(accumulate([(size + _PAD - 1) & -_PAD for size in out.sizes], initial=0))
    spans = array("q", bytes(16 * len(out.sizes)))
    spans[::2] = array("q", starts[:-1])
    spans[1::2] = array("q", out.sizes)
    message[BUFFERS_AT : BUFFERS_AT + 16 * len(out.sizes)] = spans.tobytes()
    struct.pack_into("<q", message, BODY_AT, starts[-1])
    return bytes(message)
