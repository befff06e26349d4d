"""The fast path of Arrow rank files: a file this format's writers wrote, decoded by compiled
loops (diag/arrow_scan.py) instead of pyarrow's reader.

pyarrow charges per array: a 100-step file is 100 batches of 63 arrays, and reading,
validating and concatenating them cost ~10 ms a file, most of a 1,024-rank run's load. Here
the batches' buffers are found, checked and concatenated in two compiled passes, and each
column becomes one pyarrow array over the concatenated buffers; `arrow_format.decoded` then
checks and packs the records exactly as it does for pyarrow's arrays. A file is taken only
when its schema message is this format's byte for byte and every batch is the writers'
template with checked numbers (diag/arrow_layout.py); anything else (truncated by a kill,
corrupt, written by another Arrow, extended) is read by pyarrow's path, which names what is
wrong. tests/unit/test_arrow_fast.py holds the two paths to the same output.

The loops are compiled with numba, which costs ~0.5 s to load: `prepare()` loads them (the
loader calls it before forking its workers for a large run); until then every file takes
pyarrow's path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from diag import arrow_format
from diag.arrow_format import STREAM_SCHEMA, ArrowRank
from diag.arrow_layout import BOOL, FIXED, LIST, NODES, STRING, STRUCT, TEMPLATE

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
    raise ImportError("diag.arrow_fast reads little-endian files on little-endian machines")


def prepare() -> None:
    """Compile (or load from numba's cache) the loops, and take the fast path from now on."""
    if not _loops:
        from diag import arrow_scan  # numba, imported only here

        for name in ("scan_messages", "check_batches", "regions", "concatenate"):
            _loops[name] = getattr(arrow_scan, name)
        sample = _HEADER + arrow_format.encode_batch([{"kind": "step", "step": 0, "t0": 0,
                                                       "t1": 1}])  # fmt: skip
        _concatenated(sample)  # each loop's first call compiles it (or loads it)


def prepared() -> bool:
    return bool(_loops)


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
        lists = _concatenated(data)
    except (IndexError, ValueError, pa.ArrowException):  # a check missed: bounds caught it
        return None
    return None if lists is None else arrow_format.decoded(lists, [], name, columns, floats)


def _concatenated(data: bytes) -> dict[str, pa.Array] | None:
    """Every column's values over the file's batches (by column: a kind's records as one
    struct array, the JSON lines as one string array), or None when the loops do not take
    the file."""
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
    arrays = _Arrays(out, offsets, totals, places)
    columns = {field.name: arrays.column() for field in STREAM_SCHEMA}
    # as `arrow_format._combined` leaves them: a column without values in any batch is empty
    return {name: lists if len(lists.values) else arrow_format._EMPTY_LISTS[name]
            for name, lists in columns.items()}  # fmt: skip


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
