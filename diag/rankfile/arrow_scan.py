"""The compiled loops of the Arrow rank-file fast path (diag/rankfile/arrow_fast.py): find a
stream's batch messages, check every number they declare, and concatenate each array's buffers over
the batches. Compiled by numba, with bounds checks (an index out of its array raises IndexError),
and cached beside this package; importing this module imports numba (~0.5 s), so only
`arrow_fast.prepare` does.

The file is hostile input. Each loop answers REJECT for anything it does not take, and the
caller then reads the file with pyarrow's path, which names the problem; the loops only need
to be right on what they accept. So they accept only what this format's writers write, more
strictly than Arrow's own validation: messages 8-byte aligned, buffers in order without
overlap, offsets starting at 0, strings in ASCII, declared null counts equal to the bitmaps'.
Every number read from the file is checked before it is used as a position or a size; sums
of them are bounded by the file's size (buffers do not overlap), so what the loops allocate
is too.
"""

from __future__ import annotations

import numba
import numpy as np

from diag.rankfile.arrow_layout import BOOL, FIXED, LIST, STRING, STRUCT

REJECT = -1
_compiled = numba.njit(cache=True, boundscheck=True)
_unchecked = numba.njit(cache=True, boundscheck=False)
"""For an inner loop that must vectorise (`_copy`): it checks its own ranges first."""
_ONES = np.array([bin(byte).count("1") for byte in range(256)], dtype=np.int64)
"""Set bits of each byte value."""


@_compiled
def scan_messages(words: np.ndarray, start: int, template: np.ndarray, fixed: np.ndarray,
                  body_at: int) -> tuple[int, np.ndarray]:  # fmt: skip
    """Where each batch message from byte `start` (8-aligned) to the end of the stream
    begins, and how many there are. `words`: the file as int64. A message is taken only when
    its words are those of `template` (a message as int64 words) at the indices `fixed` (the
    words that hold no number) and its body fits the file. REJECT as the count: something
    else (a truncated or foreign message)."""
    size = 8 * len(template)
    total = 8 * len(words)
    starts = np.zeros((total - start) // size + 1, dtype=np.int64)
    count = 0
    at = start
    while at < total:
        first = at >> 3
        if words[first] == 0xFFFFFFFF:  # the end-of-stream marker
            break
        if total - at < size:
            return REJECT, starts
        for i in fixed:
            if words[first + i] != template[i]:
                return REJECT, starts
        body = words[(at + body_at) >> 3]
        if body < 0 or body % 8 != 0 or body > total - at - size:
            return REJECT, starts
        starts[count] = at
        count += 1
        at += size + body
    return count, starts


@_compiled
def _bits_set(u8: np.ndarray, at: int, count: int) -> int:
    """Set bits among the first `count` bits of the bitmap at byte `at`."""
    full = count >> 3
    ones = 0
    for i in range(at, at + full):
        ones += _ONES[u8[i]]
    rest = count & 7
    if rest:
        ones += _ONES[u8[at + full] & ((1 << rest) - 1)]
    return ones


@_compiled
def _offsets_end(quads: np.ndarray, at: int, size: int, length: int, limit: int) -> int:
    """The last of `length + 1` int32 offsets at byte `at` (a buffer of `size` bytes), when
    they start at 0, never decrease and end at most at `limit`; REJECT otherwise. An empty
    buffer stands for no values."""
    if size == 0 and length == 0:
        return 0
    if size < 4 * (length + 1) or at % 4 != 0:
        return REJECT
    first = at >> 2
    ordered = quads[first] == 0
    for i in range(first + 1, first + length + 1):  # no branch: the loop vectorises
        ordered &= quads[i] >= quads[i - 1]
    end = quads[first + length]
    return end if ordered and end <= limit else REJECT


@_compiled
def _ascii(words: np.ndarray, u8: np.ndarray, at: int, size: int) -> bool:
    """Whether the `size` bytes at byte `at` (8-aligned) are ASCII (pyarrow's path checks
    the UTF-8 of anything else)."""
    high = 0
    whole = size >> 3
    for w in range(at >> 3, (at >> 3) + whole):
        high |= words[w]
    for i in range(at + 8 * whole, at + size):
        high |= u8[i]
    return (high & 0x8080808080808080) == 0


@_compiled
def check_batches(
    words: np.ndarray,
    starts: np.ndarray,
    count: int,
    where: np.ndarray,
    layouts: np.ndarray,
    parents: np.ndarray,
    first_buffers: np.ndarray,
) -> np.ndarray:
    """Check every batch's nodes and buffers against the layout (`where`: the message's
    size, then where its body length, nodes and buffers are, in bytes); per node, the totals
    over the batches: (values, nulls, the values its offsets reach: a list's child values or
    a string's bytes). A first row of REJECT: some batch is not taken."""
    u8, quads = words.view(np.uint8), words.view(np.int32)
    size, body_at, nodes_at, buffers_at = where[0], where[1], where[2], where[3]
    node_count = len(layouts)
    totals = np.zeros((node_count, 3), dtype=np.int64)
    lengths = np.zeros(node_count, dtype=np.int64)
    ends = np.zeros(node_count, dtype=np.int64)
    for b in range(count):
        at = starts[b]
        base, body = at + size, words[(at + body_at) >> 3]
        nodes, buffers = (at + nodes_at) >> 3, (at + buffers_at) >> 3
        end_before = 0  # where the previous buffer ends
        for j in range(node_count):
            length, nulls = words[nodes + 2 * j], words[nodes + 2 * j + 1]
            parent, layout, first = parents[j], layouts[j], first_buffers[j]
            if parent < 0:
                expected = 1
            elif layouts[parent] == LIST:
                expected = ends[parent]
            else:
                expected = lengths[parent]
            fits = length == expected and 0 <= nulls <= length
            fits &= nulls == 0 or (parent >= 0 and layout != STRUCT)  # never null: both
            width = 1 if layout == STRUCT else (3 if layout == STRING else 2)
            for k in range(first, first + width):  # in the body, aligned, in order
                offset, extent = words[buffers + 2 * k], words[buffers + 2 * k + 1]
                fits &= end_before <= offset <= body and offset % 8 == 0
                fits &= 0 <= extent <= body - offset
                end_before = offset + extent
            if not fits:
                totals[0, 0] = REJECT
                return totals
            validity = base + words[buffers + 2 * first]
            if nulls > 0:
                extent = words[buffers + 2 * first + 1]
                if extent < (length + 7) >> 3 or _bits_set(u8, validity, length) != length - nulls:
                    totals[0, 0] = REJECT
                    return totals
            end = 0
            data, extent = base + words[buffers + 2 * first + 2], words[buffers + 2 * first + 3]
            if layout in (FIXED, BOOL):
                fits = extent >= (8 * length if layout == FIXED else (length + 7) >> 3)
            elif layout in (LIST, STRING):
                text = 0
                limit = 2**31 - 1
                if layout == STRING:
                    text, limit = (
                        base + words[buffers + 2 * first + 4],
                        words[buffers + 2 * first + 5],
                    )
                end = _offsets_end(quads, data, extent, length, limit)
                fits = end >= 0 and (layout == LIST or _ascii(words, u8, text, end))
            if not fits:
                totals[0, 0] = REJECT
                return totals
            lengths[j] = length
            ends[j] = end
            totals[j, 0] += length
            totals[j, 1] += nulls
            totals[j, 2] += end
    for j in range(node_count):  # int32 offsets over the whole file
        if totals[j, 0] >= 2**31 - 1 or totals[j, 2] >= 2**31 - 1:
            totals[0, 0] = REJECT
            return totals
    return totals


@_compiled
def _align(size: int) -> int:
    return (size + 7) & ~7


@_compiled
def regions(layouts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Where each node's concatenated buffers go in the output bytes (validity bitmap, data:
    values, bits or string bytes), 8-byte aligned, and in the output int32 offsets; the last
    row: the sizes of both."""
    node_count = len(layouts)
    places = np.zeros((node_count + 1, 3), dtype=np.int64)
    size, quads = 0, 0
    for j in range(node_count):
        values, nulls, target = totals[j, 0], totals[j, 1], totals[j, 2]
        layout = layouts[j]
        places[j, 0] = size
        if nulls > 0:
            size += _align((values + 7) >> 3)
        places[j, 1] = size
        if layout == FIXED:
            size += 8 * values
        elif layout == BOOL:
            size += _align((values + 7) >> 3)
        elif layout == STRING:
            size += _align(target)
        places[j, 2] = quads
        if layout in (LIST, STRING):
            quads += values + 1
    places[node_count, 0] = size
    places[node_count, 2] = quads
    return places


@_compiled
def _copy_bits(u8: np.ndarray, at: int, count: int, out: np.ndarray, to: int, done: int) -> None:
    """`count` bits from the bitmap at byte `at` (all set when `at` < 0) to `out`'s bitmap at
    byte `to`, from bit `done` on (a byte at a time, shifted into place; `out` zeroed)."""
    shift = done & 7
    target = to + (done >> 3)
    for k in range((count + 7) >> 3):
        byte = 0xFF if at < 0 else np.int64(u8[at + k])
        left = count - 8 * k
        if left < 8:
            byte &= (1 << left) - 1
        out[target + k] |= (byte << shift) & 0xFF
        if shift and byte >> (8 - shift):
            out[target + k + 1] |= byte >> (8 - shift)


@_unchecked
def _copy(source: np.ndarray, at: int, target: np.ndarray, to: int, size: int, add: int) -> None:
    """`size` values of `source` from index `at` to `target` from index `to`, each plus `add`:
    a loop not bounds-checked by numba (so that it vectorises), its ranges checked here."""
    if size < 0 or at < 0 or to < 0 or size > len(source) - at or size > len(target) - to:
        raise IndexError("a copy outside its buffers")
    for k in range(size):
        target[to + k] = source[at + k] + add


@_compiled
def concatenate(
    words: np.ndarray,
    starts: np.ndarray,
    count: int,
    where: np.ndarray,
    layouts: np.ndarray,
    first_buffers: np.ndarray,
    totals: np.ndarray,
    places: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Every node's buffers over the checked batches, one after the other, at `places`:
    the output bytes (bitmaps where a node has nulls, values, bits, string bytes) and int32
    offsets (shifted to count from the start of the file's values)."""
    u8, quads = words.view(np.uint8), words.view(np.int32)
    size, nodes_at, buffers_at = where[0], where[2], where[3]
    node_count = len(layouts)
    out_words = np.empty(places[node_count, 0] >> 3, dtype=np.int64)
    out = out_words.view(np.uint8)
    for j in range(node_count):  # the bitmaps and bits are set bit by bit: zeroed first
        if totals[j, 1] > 0:
            out[places[j, 0] : places[j, 1]] = 0
        if layouts[j] == BOOL:
            out[places[j, 1] : places[j + 1, 0]] = 0
    offsets = np.empty(places[node_count, 2], dtype=np.int32)
    done = np.zeros(node_count, dtype=np.int64)  # values written so far
    reached = np.zeros(node_count, dtype=np.int64)  # what the offsets reach so far
    for b in range(count):
        at = starts[b]
        base = at + size
        nodes, buffers = (at + nodes_at) >> 3, (at + buffers_at) >> 3
        for j in range(node_count):
            length, nulls = words[nodes + 2 * j], words[nodes + 2 * j + 1]
            layout, first = layouts[j], first_buffers[j]
            if totals[j, 1] > 0:
                validity = base + words[buffers + 2 * first] if nulls > 0 else -1
                _copy_bits(u8, validity, length, out, places[j, 0], done[j])
            data = base + words[buffers + 2 * first + 2]
            if layout == FIXED:
                _copy(words, data >> 3, out_words, (places[j, 1] >> 3) + done[j], length, 0)
            elif layout == BOOL:
                _copy_bits(u8, data, length, out, places[j, 1], done[j])
            elif layout in (LIST, STRING):
                first_offset = places[j, 2] + done[j]
                end = 0
                if length > 0:
                    _copy(quads, data >> 2, offsets, first_offset, length, reached[j])
                    end = quads[(data >> 2) + length]
                if layout == STRING:
                    text = base + words[buffers + 2 * first + 4]
                    _copy(u8, text, out, places[j, 1] + reached[j], end, 0)
                reached[j] += end
            done[j] += length
    for j in range(node_count):
        if layouts[j] == LIST or layouts[j] == STRING:
            offsets[places[j, 2] + done[j]] = reached[j]
    return out, offsets
