"""A trace's events decoded a batch at a time as the file inflates: the text of a large trace,
or all its events at once, never sits in memory whole.

JSON is split where it is safe to split: a small lexer (numpy, a chunk at a time) finds the
brackets outside strings and their depth, hence the top-level `"traceEvents": [` array and
each event object in it. Each chunk's complete events are decoded as one JSON array (msgspec,
`events.BATCH_DECODER`) and handed to the caller; the document without its events (the
metadata and an empty `traceEvents`) is decoded at the end (`events.KEPT_DECODER`), so
every byte of the file is parsed by msgspec once. Anything else (an element that is not an
object, a second `traceEvents`, a truncated file, invalid JSON) raises `NotStreamable`
before or after some batches, and the caller reads the file whole instead, which reports
the error as before. The inflating keeps diag/contract/limits.py's bound on gzip.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import BinaryIO, cast

import numpy as np

from diag.contract.files import open_regular
from diag.contract.limits import (
    GZIP_MAX_RATIO,
    GZIP_MIN_INFLATED_BYTES,
    MAX_TRACE_EVENT_BYTES,
    MAX_TRACE_FILE_BYTES,
)
from diag.errors import InputError
from diag.read.kineto.events import (
    BATCH_DECODER,
    DECODE_ERRORS,
    KEPT_DECODER,
    Kept,
    KeptTrace,
)
from diag.read.kineto.scanned import AVAILABLE, ScanMemo, ScannedBatch, scan_batch

CHUNK_BYTES = 2**20
"""Inflated bytes read (and events decoded) at a time."""
MAX_TRIES = 3
"""Places tried as a batch's end in one chunk before waiting for the next chunk."""
MAX_REFUSED = 2
"""Chunks in a row without a batch that decodes (each having a place to try) before the file
is read whole (the decoder refuses something in it, or an event is that large)."""
KEY_LOOKBACK_BYTES = 256
"""How far before an array's `[` its key is looked for (more whitespace: read whole)."""
_EVENTS_KEY = re.compile(rb'[{,][ \t\n\r]*"traceEvents"[ \t\n\r]*:[ \t\n\r]*\Z')
_REFUSED: tuple[type[Exception], ...] = (*DECODE_ERRORS, RecursionError)
"""What msgspec raises on text it refuses (the whole file's read then says why)."""
_OBJECT_THEN_COMMA = re.compile(rb"\}[ \t\n\r]*,")
_FIRST_GAP = re.compile(rb"[ \t\n\r]*")
_GAP = re.compile(rb"[ \t\n\r]*,[ \t\n\r]*")
_QUOTE, _BACKSLASH, _OPEN, _CLOSE = 1, 2, 3, 4
_CLASS = np.zeros(256, dtype=np.int8)
_CLASS[ord('"')], _CLASS[ord("\\")] = _QUOTE, _BACKSLASH
_CLASS[ord("{")] = _CLASS[ord("[")] = _OPEN
_CLASS[ord("}")] = _CLASS[ord("]")] = _CLOSE
_ARRAY = ord("[")


_CORRUPT: tuple[type[Exception], ...] = (EOFError, gzip.BadGzipFile, zlib.error)
"""What a truncated or corrupt gzip raises as it is read (with ISA-L's own error)."""
_gzip: ModuleType = gzip
try:  # Intel's ISA-L inflates 3.5x faster than zlib: a fifth of reading a gzipped trace
    from isal import igzip
    from isal.igzip_lib import IsalError

    _gzip, _CORRUPT = igzip, (*_CORRUPT, cast(type[Exception], IsalError))
except ImportError:  # an install without it: Python's own, the same text
    pass


class NotStreamable(Exception):
    """The trace is not read a batch at a time: the caller reads it whole."""


def stream_events(
    path: Path,
    take: Callable[[list[Kept]], None],
    take_scanned: Callable[[ScannedBatch], None] | None = None,
) -> KeptTrace:
    """Hand `take` the trace's events, a batch at a time, in file order; the trace's metadata.
    With `take_scanned`, a batch the C scanner reads goes to it instead, as columns
    (scanned.py). InputError for an unreadable file or a gzip bomb; NotStreamable for
    anything else that is not a well-formed trace with its events in one top-level array."""
    memo = ScanMemo() if take_scanned is not None and AVAILABLE else None
    lexer = _Lexer()
    buffer = bytearray()  # the text from `start` on
    start = 0
    head = b""  # the text up to the events' `[` (inclusive) once found
    cut = -1  # where the events not yet handed on begin (-1: the array not found yet)
    first_batch, refused = True, 0
    for chunk in inflated(path):
        chunk_start = start + len(buffer)
        buffer += chunk
        if len(buffer) - max(cut - start, 0) > MAX_TRACE_EVENT_BYTES:  # held, not handed on
            what = "the text before the events" if cut < 0 else "an event"
            raise NotStreamable(f"{what} over {MAX_TRACE_EVENT_BYTES // 2**20} MiB")
        if cut < 0:  # still in the metadata before the events: lexed
            at, char, depth = lexer.brackets(chunk, chunk_start)
            opened = _events_array(buffer, start, at, char, depth)
            if opened is None:
                continue
            head, cut = bytes(buffer[: opened + 1 - start]), opened + 1
            chunk_start = cut
        events, end, tried = _batch(buffer, cut - start, chunk_start - start - 1, first_batch, memo)
        if events is None:
            refused += tried > 0
            if refused > MAX_REFUSED:
                raise NotStreamable("events the typed decoder refuses")
            continue
        if isinstance(events, ScannedBatch):
            assert take_scanned is not None
            take_scanned(events)
        else:
            take(events)
        first_batch, refused = False, 0
        del buffer[:end]
        start += end
        cut = start
    if cut < 0:
        raise NotStreamable("no traceEvents array")
    return _last(head, buffer[cut - start :], first_batch, take)


def _batch(
    buffer: bytearray, cut: int, search_from: int, first_batch: bool, memo: ScanMemo | None
) -> tuple[list[Kept] | ScannedBatch | None, int, int]:
    """The events from `cut` (after the last batch: a comma, unless `first_batch`, then an
    event) to the last end of an object followed by a comma at or after `search_from`, where
    they end, and how many places were tried; no events when none decodes.

    Where an object ends is found by looking (`}` then a comma) and proved by decoding: from
    the start of an event, text that decodes as a list of objects ends where an event ends,
    since a cut inside a string or inside an event leaves something unclosed. A place that
    does not decode is one inside an event (or the trace has what the decoder refuses): the
    one before it is tried, MAX_TRIES in all. With `memo` (scanned.scan_batch's), the C
    scanner reads the events where it can; msgspec decodes where it does not."""
    position = len(buffer)
    search_from = max(search_from, cut)
    for tried in range(MAX_TRIES):
        position = buffer.rfind(b"}", search_from, position)
        while position >= 0 and not _OBJECT_THEN_COMMA.match(buffer, position):
            position = buffer.rfind(b"}", search_from, position)
        if position < 0:
            return None, 0, tried
        gap = (_FIRST_GAP if first_batch else _GAP).match(buffer, cut, position)
        if gap is None:
            raise NotStreamable("a value between events that is not an object")
        scanned = None if memo is None else scan_batch(buffer, gap.end(), position + 1, memo)
        if scanned is not None:
            return scanned, position + 1, tried + 1
        try:
            events = _decoded_in_place(buffer, gap.end(), position + 1)
        except _REFUSED:
            continue
        return events, position + 1, tried + 1
    return None, 0, MAX_TRIES


def _decoded_in_place(buffer: bytearray, first: int, end: int) -> list[Kept]:
    """buffer[first:end] decoded as a JSON array without copying it: the bytes either side
    (a separator or whitespace, `first` > 0 and `end` < len(buffer)) are made its brackets
    for the decoding and put back."""
    before, after = buffer[first - 1], buffer[end]
    buffer[first - 1], buffer[end] = ord("["), ord("]")
    try:
        with memoryview(buffer)[first - 1 : end + 1] as text:
            return BATCH_DECODER.decode(text)
    finally:
        buffer[first - 1], buffer[end] = before, after


def _last(
    head: bytes, rest: bytearray, first_batch: bool, take: Callable[[list[Kept]], None]
) -> KeptTrace:
    """The events after the last batch and the metadata, decoded as the document they are
    with the events before them left out."""
    gap = None if first_batch else _GAP.match(rest)
    if gap is not None:
        if rest[gap.end() : gap.end() + 1] != b"{":
            raise NotStreamable("a comma after the last event")
        rest = rest[gap.end() :]
    if b'"traceEvents"' in rest:
        raise NotStreamable("a second traceEvents, or the name in an event")
    try:
        trace = KEPT_DECODER.decode(head + rest)
    except _REFUSED:  # the whole file's read says why
        raise NotStreamable("not a valid trace") from None
    take(trace.traceEvents)
    trace.traceEvents = []
    return trace


def _events_array(
    buffer: bytearray, start: int, at: np.ndarray, char: np.ndarray, depth: np.ndarray
) -> int | None:
    """Where the top-level `"traceEvents": [` opens among these brackets, if it does."""
    for p in at[(char == _ARRAY) & (depth == 2)].tolist():
        before = buffer[max(0, p - start - KEY_LOOKBACK_BYTES) : p - start]
        if _EVENTS_KEY.search(before):
            return int(p)
    return None


def inflated(path: Path) -> Iterator[bytes]:
    """The file's text a chunk at a time; a compressed one refused as soon as it passes
    GZIP_MAX_RATIO times its size on disk (or GZIP_MIN_INFLATED_BYTES)."""
    try:
        with open_regular(path, MAX_TRACE_FILE_BYTES) as raw:
            if not path.name.endswith(".gz"):
                while chunk := raw.read(CHUNK_BYTES):
                    yield chunk
                return
            yield from _inflated_gzip(path, raw)
    except _CORRUPT as err:
        raise InputError(path, f"truncated or corrupt gzip ({err})") from None
    except OSError as err:
        raise InputError(path, f"cannot read ({err.strerror or err})") from None


def _inflated_gzip(path: Path, raw: BinaryIO) -> Iterator[bytes]:
    """The opened compressed file inflated a chunk at a time, within its bound."""
    size = os.fstat(raw.fileno()).st_size
    limit = max(GZIP_MIN_INFLATED_BYTES, GZIP_MAX_RATIO * size)
    total = 0
    with _gzip.GzipFile(fileobj=raw, mode="rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            total += len(chunk)
            if total > limit:
                raise InputError(
                    path,
                    f"refused: inflates past {limit // 2**20} MiB, over {GZIP_MAX_RATIO} "
                    f"times its {size / 2**20:.1f} MiB on disk (a gzip bomb?)",
                )
            yield chunk


class _Lexer:
    """JSON's brackets outside strings, a chunk at a time: each one's position, byte and the
    depth after it. A quote ends a string unless an odd run of backslashes precedes it."""

    def __init__(self) -> None:
        self.in_string = False
        self.depth = 0
        self.backslashes = 0  # the run of backslashes that ended the previous chunk

    def brackets(self, chunk: bytes, offset: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        text = np.frombuffer(chunk, dtype=np.uint8)
        kind = _CLASS[text]
        at = np.flatnonzero(kind)
        kinds = kind[at]
        quotes = at[kinds == _QUOTE]
        slashes = at[kinds == _BACKSLASH]
        if len(slashes) or self.backslashes:
            quotes = quotes[~self._escaped(quotes, slashes)]
        self._carry_backslashes(slashes, len(text))
        brackets = at[kinds >= _OPEN]
        outside = (np.searchsorted(quotes, brackets) + self.in_string) % 2 == 0
        brackets = brackets[outside]
        step = np.where(kinds[kinds >= _OPEN][outside] == _OPEN, 1, -1)
        depth = self.depth + np.cumsum(step)
        self.in_string = bool((len(quotes) + self.in_string) % 2)
        if len(depth):
            self.depth = int(depth[-1])
            if depth.min() < 0:
                raise NotStreamable("a bracket closes more than opened")
        return brackets + offset, text[brackets], depth

    def _escaped(self, quotes: np.ndarray, slashes: np.ndarray) -> np.ndarray:
        """Which quotes an odd run of backslashes (carried from the last chunk too) precedes."""
        after_slash = np.isin(quotes - 1, slashes)
        if self.backslashes:
            after_slash |= quotes == 0
        escaped = np.zeros(len(quotes), dtype=bool)
        if not after_slash.any():
            return escaped
        # each backslash's run begins where the previous backslash is not just before it
        run_begins = np.ones(len(slashes), dtype=bool)
        run_begins[1:] = slashes[1:] != slashes[:-1] + 1
        begin_at = slashes[np.maximum.accumulate(np.where(run_begins, np.arange(len(slashes)), 0))]
        which = np.flatnonzero(after_slash)
        quote = quotes[which]
        runs = np.zeros(len(which), dtype=np.int64)
        here = quote > 0  # the backslash before it is in this chunk
        runs[here] = quote[here] - begin_at[np.searchsorted(slashes, quote[here] - 1)]
        runs += np.where(quote == runs, self.backslashes, 0)  # the run began in the last chunk
        escaped[which] = runs % 2 == 1
        return escaped

    def _carry_backslashes(self, slashes: np.ndarray, size: int) -> None:
        """The run of backslashes the chunk ends with (with the previous one's, when the whole
        chunk is that run)."""
        run = 0
        while run < len(slashes) and slashes[len(slashes) - 1 - run] == size - 1 - run:
            run += 1
        self.backslashes = run + (self.backslashes if run == size else 0)
