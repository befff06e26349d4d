"""The fast path of Arrow rank files: a file this format's writers wrote, decoded by compiled loops
(diag/rankfile/arrow_scan.py) instead of pyarrow's reader.

pyarrow charges per array: a 100-step file is 100 batches of 63 arrays, and reading, validating and
concatenating them cost ~10 ms a file, most of a 1,024-rank run's load. Here the batches' buffers
are found, checked and concatenated in two compiled passes, and each column becomes one pyarrow
array over the concatenated buffers; `arrow_format.decoded` then checks and packs the records
exactly as it does for pyarrow's arrays. A file is taken only when its schema message is this
format's byte for byte and every batch is the writers' template with checked numbers
(diag/rankfile/arrow_layout.py); anything else (truncated by a kill, corrupt, written by another
Arrow, extended) is read by pyarrow's path, which names what is wrong. tests/unit/test_arrow_fast.py
holds the two paths to the same output.

The loops are compiled with numba, which costs ~0.5 s to load: `prepare()` loads them (the
loader calls it before forking its workers for a large run); until then every file takes
pyarrow's path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from diag.contract.limits import MAX_ABS_TIME_NS, MAX_INDEX, MAX_LABEL_CHARS, MAX_STEP
from diag.rankfile import arrow_format
from diag.rankfile.arrow_checks import INDICES, LABELS
from diag.rankfile.arrow_format import KIND_FIELDS, STREAM_SCHEMA, ArrowRank
from diag.rankfile.arrow_layout import BOOL, FIXED, LIST, NODES, STRING, STRUCT, TEMPLATE
from diag.rankfile.records import INT_COLUMNS, Encoded, Packed

FAST_FROM_BYTES = 256 * 2**10
"""Smaller files take pyarrow's path even when the loops are loaded (its fixed cost is small)."""
_HEADER = arrow_format.stream_header()
_LAYOUTS = np.array([node.layout for node in NODES], dtype=np.int64)
_PARENTS = np.array([node.parent for node in NODES], dtype=np.int64)
_FIRST_BUFFERS = np.array([node.first_buffer for node in NODES], dtype=np.int64)
_WHERE = np.array([8 * len(TEMPLATE.message), TEMPLATE.body_at, TEMPLATE.nodes_at,
                   TEMPLATE.buffers_at], dtype=np.int64)  # fmt: skip
"""A batch message's size, and where its body length, nodes and buffers are (bytes)."""
_loops: dict[str, Callable[..., Any]] = {}
if sys.byteorder != "little":  # the IPC format is little-endian; the loops read native ints
    raise ImportError(
        "diag.rankfile.arrow_fast reads little-endian files on little-endian machines"
    )


def prepare() -> None:
    """Compile (or load from numba's cache) the loops, and take the fast path from now on."""
    if not _loops:
        from diag.rankfile import arrow_codes, arrow_scan  # numba, imported only here

        for name in ("scan_messages", "check_batches", "regions", "concatenate"):
            _loops[name] = getattr(arrow_scan, name)
        _loops["encode"] = arrow_codes.encode
        span = {"kind": "span", "step": 0, "phase": "fwd", "mb": 0, "t0": 0, "t1": 1}
        sample = _HEADER + arrow_format.encode_batch([span])
        names = {kind: () for kind in arrow_format.KIND_FIELDS} | {"span": ("phase",)}
        decode_fast(sample, "", names, {})  # each loop's first call compiles it (or loads it)


def decode(
    data: bytes,
    name: str,
    columns: Mapping[str, tuple[str, ...]],
    floats: Mapping[str, Iterable[str]],
) -> ArrowRank:
    """`arrow_format.decode` of a rank file, through the compiled loops when they are loaded,
    the file is large enough and it is one they take."""
    fast = decode_fast(data, name, columns, floats) if len(data) >= FAST_FROM_BYTES else None
    return fast if fast is not None else arrow_format.decode(data, name, columns, floats)


def decode_fast(
    data: bytes,
    name: str,
    columns: Mapping[str, tuple[str, ...]],
    floats: Mapping[str, Iterable[str]],
) -> ArrowRank | None:
    """`arrow_format.decode` of a file the compiled loops take; None when they are not loaded
    or do not take it."""
    if not _loops:
        return None
    try:
        buffers = _concatenated(data)
        if buffers is None:
            return None
        lists = buffers.lists()

        def direct(kind: str) -> tuple[dict[str, Packed], int] | None:
            numeric = frozenset(floats.get(kind, ()))
            return packed_kind(buffers, kind, columns[kind], numeric)

        return arrow_format.decoded(lists, [], name, columns, floats, buffers.encoded, direct)
    except (IndexError, ValueError, pa.ArrowException):  # a check missed: bounds caught it
        return None


def _concatenated(data: bytes) -> _Buffers | None:
    """Every array's buffers over the file's batches, or None when the loops do not take the
    file."""
    if not data.startswith(_HEADER) or len(data) % 8 or len(data) == len(_HEADER):
        return None
    words = np.frombuffer(data, dtype=np.int64)
    if words.ctypes.data % 8:
        words = words.copy()  # the loops read int32 and int64 in place
    template = TEMPLATE
    count, starts = _loops["scan_messages"](
        words, len(_HEADER), template.message, template.fixed, template.body_at
    )
    if count <= 0:
        return None
    totals = _loops["check_batches"](
        words, starts, count, _WHERE, _LAYOUTS, _PARENTS, _FIRST_BUFFERS
    )
    if totals[0, 0] < 0:
        return None
    places = _loops["regions"](_LAYOUTS, totals)
    out, offsets = _loops["concatenate"](
        words, starts, count, _WHERE, _LAYOUTS, _FIRST_BUFFERS, totals, places
    )
    return _Buffers(out, offsets, totals, places)


def _field_nodes() -> dict[tuple[str, str], tuple[int, int]]:
    """By (kind, field): the node of the field's values and that of the kind's column."""
    found = {}
    for column, node in enumerate(NODES):
        if node.parent == -1 and node.layout == LIST and column + 1 < len(NODES):
            struct = NODES[column + 1]
            if struct.layout != STRUCT:
                continue
            kind = STREAM_SCHEMA.field(sum(n.parent == -1 for n in NODES[:column])).name
            child = column + 2
            for field in struct.type:
                found[kind, field.name] = (child, column)
                child += _subtree_size(child)
    return found


def _subtree_size(index: int) -> int:
    """How many nodes the array at `index` and its descendants take."""
    size = 1
    while index + size < len(NODES) and _descends(index + size, index):
        size += 1
    return size


def _descends(node: int, ancestor: int) -> bool:
    while node >= 0:
        node = NODES[node].parent
        if node == ancestor:
            return True
    return False


_FIELD_NODES = _field_nodes()
_COLUMN_NODES = {
    field.name: [j for j, node in enumerate(NODES) if node.parent == -1][i]
    for i, field in enumerate(STREAM_SCHEMA)
}
"""By column: the node of its lists."""


class _Buffers:
    """The concatenated buffers of a file's arrays (diag/rankfile/arrow_scan.py `concatenate`), as
    pyarrow arrays and as dictionary-encoded labels."""

    def __init__(
        self, out: np.ndarray, offsets: np.ndarray, totals: np.ndarray, places: np.ndarray
    ) -> None:
        self.out, self.offsets, self.totals, self.places = out, offsets, totals, places

    def lists(self) -> Mapping[str, pa.ListArray]:
        """Every column's lists, one a batch, as `arrow_format._combined` makes them (a column
        without values in any batch: empty), each made when first asked for."""
        return _Lists(self)

    def column(self, name: str) -> pa.ListArray:
        arrays = _Arrays(self.out, self.offsets, self.totals, self.places)
        arrays.at = _COLUMN_NODES[name]
        lists = arrays.column()
        return lists if len(lists.values) else arrow_format.EMPTY_LISTS[name]

    def records(self, kind: str) -> int:
        """How many records of `kind` the file holds."""
        return int(self.totals[_COLUMN_NODES[kind] + 1, 0])

    def field(self, kind: str, name: str) -> Field | None:
        """A kind's field over every record of the file as numpy arrays; None when the kind
        has no such field."""
        nodes = _FIELD_NODES.get((kind, name))
        if nodes is None:
            return None
        j = nodes[0]
        node = NODES[j]
        values, nulls = int(self.totals[j, 0]), int(self.totals[j, 1])
        at, start = int(self.places[j, 0]), int(self.places[j, 1])
        valid = None
        if nulls:
            bitmap = self.out[at : at + (values + 7) // 8]
            valid = np.unpackbits(bitmap, bitorder="little")[:values].astype(bool)
        if node.layout == FIXED:
            dtype = np.int64 if node.type == pa.int64() else np.float64
            return Field(node.type, valid, self.out[start : start + 8 * values].view(dtype))
        if node.layout == STRING:
            first = int(self.places[j, 2])
            return Field(node.type, valid, self.offsets[first : first + values + 1])
        if node.layout == BOOL:
            bits = self.out[start : start + (values + 7) // 8]
            return Field(node.type, valid, np.unpackbits(bits, bitorder="little")[:values])
        return Field(node.type, valid, np.zeros(0))

    def encoded(self, kind: str, name: str) -> Encoded | None:
        """A kind's field, every record of the file, dictionary-encoded as pyarrow encodes it
        (`arrow_checks.packed`); None for a field that is not a label."""
        nodes = _FIELD_NODES.get((kind, name))
        if nodes is None:
            return None
        j, column = nodes
        layout = NODES[j].layout
        values, nulls, target = (int(v) for v in self.totals[j])
        start = int(self.places[j, 1])
        offsets = np.zeros(0, dtype=np.int32)
        if layout == STRING:
            first = int(self.places[j, 2])
            offsets = self.offsets[first : first + values + 1]
            data, width = self.out[start : start + target], 0
        elif layout == FIXED and NODES[j].type == pa.int64():
            data, width = self.out[start : start + 8 * values], 8
        elif layout == BOOL:
            bits = self.out[start : start + (values + 7) // 8]
            data, width = np.unpackbits(bits, bitorder="little")[:values], 1
        else:
            return None
        at = int(self.places[j, 0])
        bitmap = self.out[at : at + (values + 7) // 8] if nulls else np.zeros(0, np.uint8)
        first_batch = int(self.places[column, 2])
        batches = self.offsets[first_batch : first_batch + int(self.totals[column, 0]) + 1]
        codes, firsts = _loops["encode"](data, offsets, width, bitmap, batches)
        return Encoded([_value(layout, data, offsets, bitmap, int(row)) for row in firsts], codes)


@dataclass(frozen=True)
class Field:
    """A field's values over a file's records: its Arrow type, which are valid (None: all),
    and its values (int64 / float64 numbers, booleans as 0/1 bytes; a string field: its
    int32 offsets; another: nothing)."""

    type: pa.DataType
    valid: np.ndarray | None
    values: np.ndarray


class _Lists(Mapping[str, pa.ListArray]):
    """A file's columns made on first access (a kind packed from its buffers needs none)."""

    def __init__(self, buffers: _Buffers) -> None:
        self.buffers = buffers
        self.made: dict[str, pa.ListArray] = {}

    def __getitem__(self, name: str) -> pa.ListArray:
        if name not in self.made:
            self.made[name] = self.buffers.column(name)
        return self.made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_COLUMN_NODES)

    def __len__(self) -> int:
        return len(_COLUMN_NODES)


def _value(layout: int, data: np.ndarray, offsets: np.ndarray, bitmap: np.ndarray,
           row: int) -> Any:  # fmt: skip
    """Row `row`'s value as pyarrow's `to_pylist` gives it."""
    if len(bitmap) and not (bitmap[row >> 3] >> (row & 7)) & 1:
        return None
    if layout == STRING:
        return data[offsets[row] : offsets[row + 1]].tobytes().decode()
    if layout == BOOL:
        return bool(data[row])
    return int(data[8 * row : 8 * row + 8].view(np.int64)[0])


class _Arrays:
    """pyarrow arrays over the concatenated buffers, node by node in IPC order."""

    def __init__(
        self, out: np.ndarray, offsets: np.ndarray, totals: np.ndarray, places: np.ndarray
    ) -> None:
        self.out, self.offsets, self.totals, self.places = out, offsets, totals, places
        self.at = 0

    def column(self) -> pa.ListArray:
        """The next column: its one-row list of every batch, one list a batch."""
        node = NODES[self.at]
        assert node.layout == LIST and node.parent == -1, "a column's node is a list"
        return self._array()

    def _bytes(self, start: int, size: int) -> pa.Buffer:
        return pa.py_buffer(self.out[start : start + size])

    def _array(self) -> pa.Array:
        j = self.at
        node = NODES[j]
        self.at += 1
        values, nulls, target = (int(v) for v in self.totals[j])
        validity = self._bytes(int(self.places[j, 0]), (values + 7) // 8) if nulls else None
        data_at = int(self.places[j, 1])
        if node.layout == STRUCT:
            children = [self._array() for _ in node.type]
            return pa.StructArray.from_arrays(children, fields=list(node.type))
        if node.layout == FIXED:
            return pa.Array.from_buffers(node.type, values,
                                         [validity, self._bytes(data_at, 8 * values)],
                                         null_count=nulls)  # fmt: skip
        if node.layout == BOOL:
            bits = self._bytes(data_at, (values + 7) // 8)
            return pa.Array.from_buffers(node.type, values, [validity, bits], null_count=nulls)
        first = int(self.places[j, 2])
        offsets = pa.py_buffer(self.offsets[first : first + values + 1])
        if node.layout == STRING:
            text = self._bytes(data_at, target)
            return pa.Array.from_buffers(node.type, values, [validity, offsets, text],
                                         null_count=nulls)  # fmt: skip
        child = self._array()
        return pa.Array.from_buffers(node.type, values, [validity, offsets], null_count=nulls,
                                     children=[child])  # fmt: skip


# A record kind packed straight from the concatenated buffers, without pyarrow arrays, when no
# record of it would be rejected. `arrow_checks.usable` rejects a record for a null or negative
# step, a step beyond MAX_STEP, null or far times, t1 before t0, an index outside 0..MAX_INDEX-1, a
# label longer than MAX_LABEL_CHARS; `packed_kind` answers None (the kind takes
# `arrow_format.decoded`'s way, which names every rejected record) unless none of those can happen,
# so that it never needs the reasons. Then each column is what `arrow_checks.packed` makes of it:
# numbers as float64 with NaN for null, the integer columns as int64, labels dictionary-encoded.
# Kinds whose records need more (expert loads' lists, events' free fields) always take the other
# way. tests/unit/test_arrow_fast.py holds both ways to the same output.

PACKED_KINDS = frozenset({"step", "span", "comm", "mem"})
"""The kinds packed here: fixed-width numbers and labels only."""


def packed_kind(
    buffers: _Buffers, kind: str, names: Collection[str], floats: Collection[str]
) -> tuple[dict[str, Packed], int] | None:
    """A kind's columns `names` (but `rank`) as `arrow_checks.packed` packs them, and how many of
    its records have a NaN loss; None when a record might be rejected or a column is not one this
    packs."""
    if kind not in PACKED_KINDS or not buffers.records(kind):
        return None
    fields = {name: buffers.field(kind, name) for name, _ in KIND_FIELDS[kind]}
    if not _all_usable(fields):
        return None
    table: dict[str, Packed] = {}
    for name in names:
        if name == "rank":
            continue
        field = fields.get(name)
        if field is None:
            return None
        if name in floats:  # counters (int64) read as floats, as `arrow_checks.packed` casts
            if field.type not in (pa.float64(), pa.int64()):
                return None
            table[name] = _floats(field)
        elif name in INT_COLUMNS:
            if field.type != pa.int64() or field.valid is not None:
                return None
            table[name] = field.values
        else:
            encoded = buffers.encoded(kind, name)
            if encoded is None:
                return None
            table[name] = encoded
    loss = fields.get("loss")
    nan_loss = 0 if loss is None else int(np.isnan(_floats(loss)).sum() - _nulls(loss))
    return table, nan_loss


def _all_usable(fields: dict[str, Field | None]) -> bool:
    """Whether `arrow_checks.usable` keeps every record of these fields (by name)."""
    step, t0, t1 = fields.get("step"), fields.get("t0"), fields.get("t1")
    if step is None or not _whole_ints(step, 0, MAX_STEP):
        return False
    if t0 is not None or t1 is not None:
        if t0 is None or t1 is None:
            return False
        if not (_whole_ints(t0, -MAX_ABS_TIME_NS + 1, MAX_ABS_TIME_NS) and
                _whole_ints(t1, -MAX_ABS_TIME_NS + 1, MAX_ABS_TIME_NS)):  # fmt: skip
            return False
        if len(t0.values) and (t1.values < t0.values).any():
            return False
    for name, field in fields.items():
        if field is None:
            return False
        if name in INDICES:
            numbers = field.values if field.valid is None else field.values[field.valid]
            if field.type != pa.int64() or not _within(numbers, 0, MAX_INDEX):
                return False
        elif name in LABELS:
            if field.type != pa.string():
                return False
            lengths = np.diff(field.values)
            if field.valid is not None:
                lengths = lengths[field.valid]
            if len(lengths) and lengths.max() > MAX_LABEL_CHARS:  # ASCII: bytes are characters
                return False
    return True


def _whole_ints(field: Field, low: int, high: int) -> bool:
    """An int64 field without nulls, every value in low..high-1."""
    return field.type == pa.int64() and field.valid is None and _within(field.values, low, high)


def _within(numbers: np.ndarray, low: int, high: int) -> bool:
    return not len(numbers) or (int(numbers.min()) >= low and int(numbers.max()) < high)


def _floats(field: Field) -> np.ndarray:
    """A float64 (or int64) field as `packed` makes it: float64, NaN where null."""
    values = field.values.astype(np.float64, copy=False)
    if field.valid is None:
        return values
    return np.where(field.valid, values, np.nan)


def _nulls(field: Field) -> int:
    return 0 if field.valid is None else int((~field.valid).sum())
