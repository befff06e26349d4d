"""The compiled dictionary encoding of the Arrow fast path's label columns
(diag/rankfile/arrow_fast.py): what pyarrow's `dictionary_encode(null_encoding="encode")` gives (the
distinct values in the order they first occur, a null one of them, int32 codes), over the
concatenated buffers of a file's batches, without pyarrow's per-value hashing where a batch repeats
the one before.

A collector records the same labels every step (the same collectives, phases, micro-batches), so
most batches hold the previous batch's values row for row: those are compared as bytes and take its
codes. Other batches are encoded row by row through a hash table. Compiled by numba with bounds
checks; the buffers were checked before (diag/rankfile/arrow_scan.py).
"""

from __future__ import annotations

import numba
import numpy as np

_compiled = numba.njit(cache=True, boundscheck=True)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@_compiled
def _span(offsets: np.ndarray, width: int, row: int) -> tuple[int, int]:
    """Where a row's bytes are: fixed `width` bytes a row, or by the int32 `offsets`."""
    if width > 0:
        return width * row, width * (row + 1)
    return offsets[row], offsets[row + 1]


@_compiled
def _valid(bitmap: np.ndarray, row: int) -> bool:
    return len(bitmap) == 0 or (bitmap[row >> 3] >> (row & 7)) & 1 == 1


@_compiled
def _same_rows(
    data: np.ndarray, offsets: np.ndarray, width: int, bitmap: np.ndarray, first: int,
    other: int, rows: int,
) -> bool:  # fmt: skip
    """Whether rows `other`.. hold what rows `first`.. hold, `rows` of them (null where null,
    the same bytes elsewhere; null rows' bytes compared too, which at worst finds a
    difference that is not one). Written without calls, so that the loops vectorise."""
    same = True
    if len(bitmap):
        for i in range(rows):
            a, b = first + i, other + i
            same &= ((bitmap[a >> 3] >> (a & 7)) & 1) == ((bitmap[b >> 3] >> (b & 7)) & 1)
    if width > 0:
        a0, b0, size = width * first, width * other, width * rows
    else:
        for i in range(rows):
            a = offsets[first + i + 1] - offsets[first + i]
            same &= a == offsets[other + i + 1] - offsets[other + i]
        a0, b0 = offsets[first], offsets[other]
        size = offsets[first + rows] - a0
    return same and _equal_ranges(data, a0, b0, size)


@numba.njit(cache=True, boundscheck=False)
def _equal_ranges(data: np.ndarray, a: int, b: int, size: int) -> bool:
    """Whether `size` bytes from `a` equal those from `b`: the one loop not bounds-checked
    by numba (so that it vectorises), its range checked here instead."""
    if size < 0 or a < 0 or b < 0 or size > len(data) - max(a, b):
        raise IndexError("byte ranges outside the buffer")
    same = True
    for k in range(size):
        same &= data[a + k] == data[b + k]
    return same


@_compiled
def _hash(data: np.ndarray, start: int, end: int) -> np.uint64:
    value = _FNV_OFFSET
    for k in range(start, end):
        value = (value ^ np.uint64(data[k])) * _FNV_PRIME
    return value


@_compiled
def encode(
    data: np.ndarray, offsets: np.ndarray, width: int, bitmap: np.ndarray, batches: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The codes of every row and, for each distinct value in the order it first occurs, the
    row where it does (a null row: the null value). Rows: `width` bytes each of `data`, or
    by the int32 `offsets` when `width` is 0; `bitmap`: their validity (empty: no nulls);
    `batches`: where each batch's rows start, then the end."""
    rows = batches[len(batches) - 1] - batches[0]
    codes = np.empty(rows, dtype=np.int32)
    firsts = np.empty(16, dtype=np.int64)
    hashes = np.empty(16, dtype=np.uint64)
    table = np.full(64, -1, dtype=np.int64)
    count = 0
    null_code = -1
    base = batches[0]
    for b in range(len(batches) - 1):
        start, end = batches[b], batches[b + 1]
        if b > 0 and end - start == start - batches[b - 1] and end > start:
            before = batches[b - 1]
            if _same_rows(data, offsets, width, bitmap, before, start, end - start):
                for i in range(end - start):
                    codes[start - base + i] = codes[before - base + i]
                continue
        for row in range(start, end):
            code, digest, slot = -1, np.uint64(0), np.int64(0)
            if not _valid(bitmap, row):
                code = null_code
            else:
                r0, r1 = _span(offsets, width, row)
                digest = _hash(data, r0, r1)
                mask = len(table) - 1
                slot = np.int64(digest & np.uint64(mask))
                while table[slot] >= 0:
                    known = table[slot]
                    if hashes[known] == digest:
                        k0, k1 = _span(offsets, width, firsts[known])
                        if k1 - k0 == r1 - r0 and _same_bytes(data, k0, r0, r1 - r0):
                            code = known
                            break
                    slot = (slot + 1) & mask
            if code < 0:  # a value not seen yet
                if count == len(firsts):
                    firsts = _grown(firsts)
                    hashes = _grown(hashes)
                code = count
                firsts[code] = row
                count += 1
                if not _valid(bitmap, row):
                    null_code = code
                    hashes[code] = 0
                else:
                    hashes[code] = digest
                    table[slot] = code
                    if 2 * count > len(table):
                        table = _rehashed(table, hashes, firsts, bitmap, count)
            codes[row - base] = code
    return codes, firsts[:count].copy()


@_compiled
def _same_bytes(data: np.ndarray, a: int, b: int, size: int) -> bool:
    for k in range(size):  # noqa: SIM110 (numba compiles no generator)
        if data[a + k] != data[b + k]:
            return False
    return True


@_compiled
def _grown(values: np.ndarray) -> np.ndarray:
    grown = np.empty(2 * len(values), dtype=values.dtype)
    grown[: len(values)] = values
    return grown


@_compiled
def _rehashed(
    table: np.ndarray, hashes: np.ndarray, firsts: np.ndarray, bitmap: np.ndarray, count: int
) -> np.ndarray:
    """The table twice as large, with every non-null value's code."""
    grown = np.full(2 * len(table), -1, dtype=np.int64)
    mask = len(grown) - 1
    for code in range(count):
        if not _valid(bitmap, firsts[code]):
            continue
        slot = np.int64(hashes[code] & np.uint64(mask))
        while grown[slot] >= 0:
            slot = (slot + 1) & mask
        grown[slot] = code
    return grown
