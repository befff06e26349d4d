"""A batch of a trace's events read as columns by the C scanner (`event_scan.c`, issue 43),
to be taken by numpy where one_pass.take would read them one by one (scanned_take.py).

Decoding every event into a struct and then reading its fields in a Python loop was most of
a trace's parse (about 70% on a real 216k-event trace). The scanner reads the fields the
loop needs (ph, cat, name, ts, dur, tid, args' correlation and stream, whether args name a
collective) straight from the text, and:
- the events it reads exactly as msgspec does are taken as columns (`scanned_take` does with
  arrays what one_pass.take does with each: the device events, the host's calls and starts,
  the kernels, the operators' times, the launches). Of those whose arguments or raw times
  the converter keeps (a step, a `record_param_comms` scope, an `nccl:` annotation, a
  collective kernel's own arguments, a gloo or c10d op), only the `args` object is decoded
  by msgspec (the scanner gives where it is), none where the event writes none, and a
  scope's or an annotation's argument text seen before is the set SharedArgs already keeps
  for it (`ScanMemo`); only those parts are taken one by one, in their order,
  so argument sets are shared as before;
- an event it does not read exactly (one the scanner marks ODD: an escaped string, a float
  it does not parse exactly, a thread that is a string ...), or of a category read as
  another's, or CUPTI's range, is decoded alone by msgspec and taken by one_pass.take itself,
  in its place: runs of each kind are taken in order, so every list, dict and count ends as
  the loop alone would leave it (tests/unit/test_kineto_scanned.py: equal states on every
  real trace, a simulated folder and random events);
- a batch the scanner does not read (text that is not well-formed events, nesting too deep,
  more events than MAX_ROWS) is decoded whole by msgspec, as before: every judgement of
  doubtful text stays msgspec's.

Without the compiled module (no C compiler at install) or with `DIAG_EVENT_SCAN=0`, every
batch is decoded by msgspec (`AVAILABLE` is False).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from msgspec.structs import replace

from diag.read.kineto.events import ARGS_DECODER, BATCH_DECODER, DECODE_ERRORS, Args, Kept
from diag.read.kineto.scan_columns import (
    ARGS,
    ARGS_END,
    ARGS_START,
    BY_LOOP,
    CAT,
    COLLECTIVE,
    CORRELATION,
    CORRELATION_AT,
    CORRELATION_END,
    CORRELATION_KIND,
    END,
    EXTERNAL_AT,
    EXTERNAL_END,
    GPU,
    INT,
    KIND,
    NAME,
    NCCL,
    NCOL,
    ODD,
    OWN_ARGS,
    PARAMS,
    START,
    string_flags,
)
from diag.read.kineto.scan_memo import MAX_TEXT_BYTES, ScanMemo, ids_cut_spans, whole_spans

try:
    import diag.read.kineto.event_scan as event_scan  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: msgspec reads every batch
    event_scan = None

AVAILABLE = event_scan is not None and os.environ.get("DIAG_EVENT_SCAN", "1") != "0"
"""The scanner reads the batches (else msgspec alone)."""

ROW_BYTES = 128
"""The rows first allocated: one per this many bytes of text (events are longer; more rows
are asked for when a batch has more)."""
MAX_ROWS = 2**18
"""At most this many rows a batch (about 55 MB with the strings' table): a batch of more
(events of a few bytes each, as only a hostile file writes) is msgspec's."""


@dataclass
class ScannedBatch:
    """A batch's events: the scanner's rows, the strings its codes name, the events decoded
    by msgspec for the loop, and the arguments of the events whose arguments are kept."""

    rows: np.ndarray  # (events, NCOL) int64
    times: np.ndarray  # (events, 2) float64: ts and dur where they are fractions
    strings: list[str]
    flags: np.ndarray  # each string's flags (below), and 0 for code -1 (none) last
    by_loop: np.ndarray  # bool per event: taken by one_pass.take
    decoded: list[Kept]  # the events taken by the loop, decoded, in order
    decoded_rows: np.ndarray  # their rows
    own_rows: np.ndarray  # the rows of the others whose arguments are kept, in order
    own_args: list[Args | None]  # their arguments (None: the event writes none)
    own_texts: list[bytes | None]  # the text of those to keep by it once shared (else None)
    own_known: np.ndarray  # bool: the arguments are the set already kept for their text
    memo: ScanMemo  # the trace's


def scan_batch(buffer: bytearray, first: int, end: int, memo: ScanMemo) -> ScannedBatch | None:
    """buffer[first:end] (events separated by commas) read by the scanner; None where msgspec
    is to decode the whole batch (the scanner does not read it, or an event it leaves to
    msgspec does not decode: the whole batch's decoding then says why). `memo`: what the
    trace's earlier batches left (filled here)."""
    assert event_scan is not None
    size = end - first
    capacity = min(max(64, size // ROW_BYTES), MAX_ROWS)
    while True:
        rows = np.empty((capacity, NCOL), dtype=np.int64)
        times = np.empty((capacity, 2), dtype=np.float64)
        strings = np.empty((3 * capacity, 2), dtype=np.int64)
        status, count, distinct = event_scan.scan(buffer, first, end, rows, times, strings)
        if status != -2 or capacity == MAX_ROWS:
            break
        capacity = min(size // 3 + 2, MAX_ROWS)  # an event is at least `{}` and a comma
    if status != 0:
        return None
    rows, times = rows[:count], times[:count]
    known = memo.flags
    with memoryview(buffer) as text:
        names = [bytes(text[a : a + n]).decode("ascii") for a, n in strings[:distinct].tolist()]
        for string in names:
            if string not in known:
                known[string] = string_flags(string)
        flags = np.array([known[n] for n in names] + [0], dtype=np.int64)  # code -1: none
        cat, name = flags[rows[:, CAT]], flags[rows[:, NAME]]
        by_loop = (rows[:, KIND] == ODD) | (((cat | name) & BY_LOOP) != 0)
        own_args = ((name & OWN_ARGS) != 0) | (((cat & GPU) != 0) & (rows[:, COLLECTIVE] != 0))
        at = np.flatnonzero(by_loop)
        own = np.flatnonzero(own_args & ~by_loop)
        try:
            decoded = _decoded(text, rows[at][:, [START, END]], BATCH_DECODER)
            args, texts, known_set = _own_arguments(text, rows[own], cat[own], name[own], memo)
        except DECODE_ERRORS:
            return None
    return ScannedBatch(
        rows, times, names, flags, by_loop, decoded, at, own, args, texts, known_set, memo
    )


def _decoded(text: memoryview, spans: np.ndarray, decoder: Any) -> list[Any]:
    """The JSON values at `spans` (start, end) of `text`, decoded together."""
    if not len(spans):
        return []
    return decoder.decode(b"[" + b",".join(text[a:b] for a, b in spans.tolist()) + b"]")


def _own_arguments(
    text: memoryview, rows: np.ndarray, cat: np.ndarray, name: np.ndarray, memo: ScanMemo
) -> tuple[list[Args | None], list[bytes | None], np.ndarray]:
    """The arguments of the events at `rows` (their cat's and name's flags given), for
    `_own_args`: None where an event writes none; a scope's or an annotation's by their text,
    a collective kernel's by its text without its ids, where `memo` keeps the set for it (and
    that text, to keep once shared, where it does not yet); the others decoded."""
    args: list[Args | None] = [None] * len(rows)
    texts: list[bytes | None] = [None] * len(rows)
    known = [False] * len(rows)
    written = rows[:, ARGS] != 0
    short = rows[:, ARGS_END] - rows[:, ARGS_START] <= MAX_TEXT_BYTES
    # a set SharedArgs keeps by its values: a scope's or an annotation's without a correlation
    by_text = written & short & ((name & (NCCL | PARAMS)) != 0) & ((cat & GPU) == 0)
    by_text &= rows[:, CORRELATION_KIND] == 0
    kept = memo.texts
    places = np.flatnonzero(by_text)
    spans = whole_spans(rows[places, ARGS_START], rows[places, ARGS_END])
    for place, key in zip(places.tolist(), _cut(text, spans), strict=True):
        found = kept.get(key)
        if found is None:
            texts[place] = key
        else:
            args[place], known[place] = found, True
    # a collective kernel's (its correlation an int, written once: else the row is ODD)
    by_ids = written & short & ((cat & GPU) != 0) & (rows[:, CORRELATION_KIND] == INT)
    places = np.flatnonzero(by_ids & (rows[:, CORRELATION_AT] > 0))
    kernels = memo.kernel_texts
    for place, key, correlation in zip(
        places.tolist(), _cut(text, _ids_cut_spans(rows[places])),
        rows[places, CORRELATION].tolist(),
        strict=True,
    ):  # fmt: skip
        found = kernels.get(key)
        if found is None:
            texts[place] = key
        else:
            args[place], known[place] = replace(found, correlation=correlation), True
    known_rows = np.array(known, dtype=bool)
    todo = np.flatnonzero(written & ~known_rows)
    for place, value in zip(
        todo.tolist(), _decoded(text, rows[todo][:, [ARGS_START, ARGS_END]], ARGS_DECODER),
        strict=True,
    ):  # fmt: skip
        args[place] = value
    return args, texts, known_rows


def _ids_cut_spans(rows: np.ndarray) -> np.ndarray:
    """`scan_memo.ids_cut_spans` of the rows' argument texts."""
    return ids_cut_spans(
        rows[:, ARGS_START],
        rows[:, ARGS_END],
        rows[:, [CORRELATION_AT, CORRELATION_END]],
        rows[:, [EXTERNAL_AT, EXTERNAL_END]],
    )


def _cut(text: memoryview, spans: np.ndarray) -> list[bytes]:
    """`event_scan.cut_texts`: per row of `spans` (start, two cuts, end), the text without
    the cuts, as bytes (one C call a batch: slicing in Python was 7% of a parse)."""
    assert event_scan is not None
    keys: list[bytes] = event_scan.cut_texts(text, np.ascontiguousarray(spans, dtype=np.int64))
    return keys
