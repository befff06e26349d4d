"""A batch of a trace's events read as columns by the C scanner (`event_scan.c`, issue 43),
and taken by numpy where one_pass.take would read them one by one.

Decoding every event into a struct and then reading its fields in a Python loop was most of
a trace's parse (about 70% on a real 216k-event trace). The scanner reads the fields the
loop needs (ph, cat, name, ts, dur, tid, args' correlation and stream, whether args name a
collective) straight from the text, and:
- the events it reads exactly as msgspec does are taken as columns (`_take_columns` does with
  arrays what one_pass.take does with each: the device events, the host's calls and starts,
  the kernels, the operators' times, the launches). Of those whose arguments or raw times
  the converter keeps (a step, a `record_param_comms` scope, an `nccl:` annotation, a
  collective kernel's own arguments, a gloo or c10d op), only the `args` object is decoded
  by msgspec (the scanner gives where it is), none where the event writes none, and a
  scope's or an annotation's argument text seen before is the set SharedArgs already keeps
  for it (`ScanMemo`); only those parts are taken one by one, in their order (`_own_args`),
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
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from msgspec.structs import replace

from diag.contract.limits import MAX_ARG_INTEGER, MAX_LABEL_CHARS
from diag.read.kineto import one_pass
from diag.read.kineto.convert import (
    DEVICE_OF_CATEGORY,
    GPU_CATEGORIES,
    LAUNCH_CATEGORIES,
    LEGACY_CATEGORIES,
    MAX_TIME_US,
    NO_ARGS,
    NS_PER_US,
    PROFILER_RANGE,
    Scan,
)
from diag.read.kineto.device import STEP_START, DeviceScan
from diag.read.kineto.events import (
    ABSENT,
    ARGS_DECODER,
    BATCH_DECODER,
    DECODE_ERRORS,
    Args,
    Kept,
)
from diag.read.kineto.host_calls import LOADER_PREFIX, WATCHED

try:
    import diag.read.kineto.event_scan as event_scan  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: msgspec reads every batch
    event_scan = None

AVAILABLE = event_scan is not None and os.environ.get("DIAG_EVENT_SCAN", "1") != "0"
"""The scanner reads the batches (else msgspec alone)."""

# the scanner's columns (event_scan.c's enum)
(KIND, START, END, PH, CAT, NAME, TS_KIND, TS, DUR_KIND, DUR, TID_KIND, TID, ARGS,
 CORRELATION_KIND, CORRELATION, STREAM_KIND, STREAM, COLLECTIVE, ARGS_START, ARGS_END,
 CORRELATION_AT, CORRELATION_END, EXTERNAL_AT, EXTERNAL_END, NCOL) = range(25)  # fmt: skip
F_TS, F_DUR = 0, 1
ODD, PH_X, INT, FLOAT = 1, 1, 1, 2
ROW_BYTES = 128
"""The rows first allocated: one per this many bytes of text (events are longer; more rows
are asked for when a batch has more)."""
MAX_ROWS = 2**18
"""At most this many rows a batch (about 55 MB with the strings' table): a batch of more
(events of a few bytes each, as only a hostile file writes) is msgspec's."""

_BY_NAME = ("nccl:", "gloo:", "c10d::", "record_param_comms", "ProfilerStep")
"""Names whose events the converter keeps with their arguments, or reads as steps."""


MAX_TEXTS = 16_384
"""Argument texts a trace's `ScanMemo` keeps (more: decoded each time)."""
MAX_TEXT_BYTES = 1_024
"""The longest argument text kept as a key (so the texts hold at most 16 MiB)."""


@dataclass
class ScanMemo:
    """What the scanner keeps across one trace's batches: each string's flags, and the
    argument sets kept for their text. A `record_param_comms` scope or an `nccl:` annotation
    repeats a few argument texts every step (55% of a simulated communication-heavy rank's
    events): an argument text seen before, whose set SharedArgs already keeps, is that set,
    not decoded again (so nothing is shared that SharedArgs would not share).

    A collective kernel's own set (newer Kineto copies the collective's arguments onto it)
    differs from its step's others only in its ids, `correlation` and `External id`: its text
    without their values (`ids_cut`) seen before is the set kept for it with this kernel's
    correlation (`External id` is not read), its values already shared."""

    flags: dict[str, int] = field(default_factory=dict)
    texts: dict[bytes, Args] = field(default_factory=dict)
    kernel_texts: dict[bytes, Args] = field(default_factory=dict)


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


# a string's flags, as a cat or as a name
BY_LOOP = 1  # taken by one_pass.take: a category read as another's, or CUPTI's range
OWN_ARGS = 2  # its event's arguments or raw time are kept: a step, scope, annotation, op
TRACE, GPU, CPU_OP, LAUNCH, WATCHED_CALL, SYNC = 4, 8, 16, 32, 64, 128
NCCL, ENQUEUE, GPU_ANNOTATION, PARAMS, STEP, KEPT_BY_NAME = 256, 512, 1024, 2048, 4096, 8192


def _flags(text: str) -> int:
    tests = (
        (BY_LOOP, text in LEGACY_CATEGORIES or text in DEVICE_OF_CATEGORY
         or text == PROFILER_RANGE),
        (OWN_ARGS, text.startswith(_BY_NAME)), (TRACE, text == "Trace"),
        (GPU, text in GPU_CATEGORIES), (CPU_OP, text == "cpu_op"),
        (LAUNCH, text in LAUNCH_CATEGORIES),
        (WATCHED_CALL, text in WATCHED or text.startswith(LOADER_PREFIX)),
        (SYNC, text in one_pass.SYNC_NAMES), (NCCL, text.startswith("nccl:")),
        (ENQUEUE, text.startswith(one_pass.STEP_OR_ENQUEUE)),
        (GPU_ANNOTATION, text == "gpu_user_annotation"), (PARAMS, text == "record_param_comms"),
        (STEP, text.startswith("ProfilerStep")),
        (KEPT_BY_NAME, text.startswith(one_pass.KEPT_BY_NAME)),
    )  # fmt: skip
    return sum(flag for flag, holds in tests if holds)


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
                known[string] = _flags(string)
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
    for place, key in zip(places.tolist(), _whole_texts(text, rows[places]), strict=True):
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
        places.tolist(), ids_cut(text, rows[places]), rows[places, CORRELATION].tolist(),
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


def _whole_texts(text: memoryview, rows: np.ndarray) -> list[bytes]:
    """Events' argument texts (the scanner's spans), as bytes."""
    start, end = rows[:, [ARGS_START]], rows[:, [ARGS_END]]
    return _cut(text, np.hstack([start, start, start, end, end, end]))


def _cut(text: memoryview, spans: np.ndarray) -> list[bytes]:
    """`event_scan.cut_texts`: per row of `spans` (start, two cuts, end), the text without
    the cuts, as bytes (one C call a batch: slicing in Python was 7% of a parse)."""
    assert event_scan is not None
    keys: list[bytes] = event_scan.cut_texts(text, np.ascontiguousarray(spans, dtype=np.int64))
    return keys


def ids_cut(text: memoryview, rows: np.ndarray) -> list[bytes]:
    """Events' argument texts without the values of their `correlation` (each has one) and
    `External id` (where it has one): the scanner's spans. The keys stay, so that texts alike
    but for those values are equal and no others are."""
    correlation = rows[:, [CORRELATION_AT, CORRELATION_END]]
    external = rows[:, [EXTERNAL_AT, EXTERNAL_END]]
    none = external[:, 0] == 0  # none: an empty cut just after the correlation's
    external[none] = correlation[none][:, [1, 1]]
    external_first = (external[:, 0] < correlation[:, 0])[:, None]
    return _cut(text, np.column_stack([
        rows[:, ARGS_START], np.where(external_first, external, correlation),
        np.where(external_first, correlation, external), rows[:, ARGS_END],
    ]))  # fmt: skip


def take_scanned(
    batch: ScannedBatch, scan: Scan, device: DeviceScan, shared: Callable[[Args], Args]
) -> None:
    """The batch's events added to `scan` and `device` as one_pass.take adds them, in order:
    the runs of events the loop takes by it, the runs of others as columns (`_take_columns`)."""
    by_loop = batch.by_loop
    edges = np.flatnonzero(np.diff(by_loop.astype(np.int8))) + 1
    bounds = np.concatenate([[0], edges, [len(by_loop)]]).tolist()
    positions = np.searchsorted(batch.decoded_rows, bounds).tolist()  # into `decoded`
    owns = np.searchsorted(batch.own_rows, bounds).tolist()  # into `own_rows`
    for a, b, pa, pb, oa, ob in zip(
        bounds[:-1], bounds[1:], positions[:-1], positions[1:], owns[:-1], owns[1:], strict=True
    ):
        if by_loop[a]:
            one_pass.take(batch.decoded[pa:pb], scan, device, shared)
        else:
            _take_columns(batch, a, b, slice(oa, ob), scan, device, shared)


def _take_columns(
    batch: ScannedBatch,
    a: int,
    b: int,
    own: slice,
    scan: Scan,
    device: DeviceScan,
    shared: Callable[[Args], Args],
) -> None:
    """Rows a..b-1 (none taken by the loop) added as one_pass.take adds them: with arrays,
    and the parts that keep an event's arguments (`own`: those events' places in the
    batch's `own_rows`) by `_own_args`."""
    rows, times, strings, flags = batch.rows[a:b], batch.times[a:b], batch.strings, batch.flags
    cat_code, name_code = rows[:, CAT], rows[:, NAME]
    cat_flags, name_flags = flags[cat_code], flags[name_code]
    ts_kind, dur_kind = rows[:, TS_KIND], rows[:, DUR_KIND]
    ts_int, dur_int = ts_kind == INT, dur_kind == INT
    ts_finite, timed = ts_kind != 0, dur_kind != 0  # a fraction the scanner reads is finite
    ts = np.where(ts_int, rows[:, TS].astype(np.float64), times[:, F_TS])
    dur = np.where(dur_int, rows[:, DUR].astype(np.float64), times[:, F_DUR])
    # (an int64 past 2**53 compares as the double above it, still beyond MAX_TIME_US)
    ts_in = (ts > -MAX_TIME_US) & (ts < MAX_TIME_US)
    dur_in = (dur > -MAX_TIME_US) & (dur < MAX_TIME_US)
    has_args = rows[:, ARGS] != 0
    correlation = np.where(has_args & (rows[:, CORRELATION_KIND] == INT), rows[:, CORRELATION], -1)
    stream = np.where(has_args & (rows[:, STREAM_KIND] == INT), rows[:, STREAM], -1)
    if not ts_int.all():
        device.whole_us = False
    # ---- the device time's: a timed event of a category, on a stream with an id, or on the host
    timed_event = ts_finite & timed & (cat_code >= 0) & ((cat_flags & TRACE) == 0) & ts_in & dur_in
    on_stream = ((stream >= 0) & (correlation >= 0)) | ((name_flags & SYNC) != 0)
    _add_device(
        device, strings, rows, ts, dur, correlation, stream, timed_event & on_stream & (stream >= 0)
    )
    host = np.flatnonzero(timed_event & ~on_stream)
    watched = host[(name_flags[host] & WATCHED_CALL) != 0]
    if len(watched):
        calls = device.host
        calls.starts.frombytes(ts[watched].tobytes())
        calls.durations.frombytes(dur[watched].tobytes())
        interned = calls._names  # one object a name (HostCallScan.add's)
        calls.names += [interned.setdefault(n, n) for n in _texts(strings, name_code[watched])]
    device.cpu_start.frombytes(ts[host].tobytes())
    device.cpu_correlation += correlation[host].tolist()
    # ---- the converter's: complete events with a time
    complete = (rows[:, PH] == PH_X) & ts_finite
    beyond = complete & (~ts_in | (timed & ~dur_in))
    negative = complete & ~beyond & timed & (dur < 0)
    out = scan.out
    if beyond.any():
        out.skipped["a time or duration beyond ±2**61 ns"] += int(beyond.sum())
    if negative.any():
        out.skipped["negative duration"] += int(negative.sum())
    kept = complete & ~beyond & ~negative
    t0 = np.where(ts_int, rows[:, TS] * NS_PER_US, 0)
    t0[~ts_int] = np.rint(times[~ts_int, F_TS] * NS_PER_US).astype(np.int64)
    length = np.where(dur_int, rows[:, DUR] * NS_PER_US, 0)
    fraction = dur_kind == FLOAT
    length[fraction] = np.rint(times[fraction, F_DUR] * NS_PER_US).astype(np.int64)
    t1 = t0 + length
    gpu = kept & ((cat_flags & GPU) != 0)
    host_kept = kept & ~gpu
    annotation = host_kept & ((name_flags & NCCL) != 0) & ((cat_flags & GPU_ANNOTATION) == 0)
    gpu_at = np.flatnonzero(gpu)
    gpu_args: list[Args | None] = [None] * len(gpu_at)  # a kernel's collective args: below
    if own.stop > own.start:
        _own_args(batch, own, a, t0, t1, kept, gpu_at, gpu_args, annotation,
                  timed_event & ~on_stream, scan, device, shared)  # fmt: skip
    if len(gpu_at):
        labels = scan.labels
        out.gpu_name += [labels.setdefault(n, n) for n in _texts(strings, name_code[gpu_at])]
        out.gpu_category += [labels.setdefault(c, c) for c in _texts(strings, cat_code[gpu_at])]
        out.gpu_args += gpu_args
        out.gpu_t0.frombytes(t0[gpu_at].tobytes())
        out.gpu_t1.frombytes(t1[gpu_at].tobytes())
        gpu_rows, gpu_has_args = rows[gpu_at], has_args[gpu_at]
        out.gpu_correlation.frombytes(_id_or_none(gpu_rows, CORRELATION_KIND, gpu_has_args))
        out.gpu_stream.frombytes(_id_or_none(gpu_rows, STREAM_KIND, gpu_has_args))
    if not host_kept.any():
        return
    first, last = int(t0[host_kept].min()), int(t1[host_kept].max())
    out.cpu_t0 = first if out.cpu_t0 is None else min(out.cpu_t0, first)
    out.cpu_t1 = last if out.cpu_t1 is None else max(out.cpu_t1, last)
    rest = host_kept & ~annotation
    operator = rest & ((cat_flags & CPU_OP) != 0) & ((name_flags & ENQUEUE) == 0)
    _add_cpu_ops(out.cpu_ops, rows, t0, t1, np.flatnonzero(operator))
    launch = np.flatnonzero(
        rest & ((cat_flags & LAUNCH) != 0) & has_args & (rows[:, CORRELATION_KIND] == INT)
    )
    if len(launch):
        ids = rows[launch, CORRELATION]
        ids = np.where((ids >= 0) & (ids < MAX_ARG_INTEGER), ids, -1).tolist()  # correlation_of
        launched = zip(_tids(rows[launch]), t0[launch].tolist(), strict=True)
        out.launches.update(zip(ids, launched, strict=True))


def _own_args(
    batch: ScannedBatch,
    own: slice,
    a: int,
    t0: np.ndarray,
    t1: np.ndarray,
    kept: np.ndarray,
    gpu_at: np.ndarray,
    gpu_args: list[Args | None],
    annotation: np.ndarray,
    on_host: np.ndarray,
    scan: Scan,
    device: DeviceScan,
    shared: Callable[[Args], Args],
) -> None:
    """What one_pass.take keeps of the events whose arguments or raw times it keeps (`own`:
    their places in the batch's `own_rows`; the run's arrays from its row `a`), as it does: a
    step's start and number, a collective kernel's arguments, an annotation's or a scope's
    arguments, a gloo or c10d op (`one_pass.keep_named`), each kind in one pass in its order
    (what one kind keeps does not depend on another's). A scope's or an annotation's set is
    kept by its text once SharedArgs keeps it, a kernel's by its text without its ids
    (ScanMemo)."""
    at = batch.own_rows[own] - a  # in the run's arrays
    rows = batch.rows[a + at]
    strings, flags = batch.strings, batch.flags
    names = _texts(strings, rows[:, NAME])
    name_flags, cat_flags = flags[rows[:, NAME]], flags[rows[:, CAT]]
    # each event's place among the run's kernels (`found`: it is one)
    place = np.searchsorted(gpu_at, at)
    found = place < len(gpu_at)
    found[found] = gpu_at[place[found]] == at[found]
    rows_of_run = (a + at).tolist()
    is_kept = kept[at]
    # a step's start (on the host) and number, kept or not
    step_starts = device.step_starts
    for i in np.flatnonzero(on_host[at] & ((name_flags & STEP) != 0)).tolist():
        if STEP_START.match(names[i]):
            ts = _raw_ts(batch, rows_of_run[i])
            step_starts[names[i]] = max(ts, step_starts.get(names[i], ts))
    args_of, texts_of = batch.own_args[own], batch.own_texts[own]
    known_of = batch.own_known[own].tolist()
    # a collective kernel's arguments (SharedArgs shares a kernel's values apart from the
    # scopes' sets: taken apart from them, in their order)
    kernel_texts = batch.memo.kernel_texts
    for i, gpu in zip(np.flatnonzero(is_kept & found).tolist(), place[is_kept & found].tolist(),
                      strict=True):  # fmt: skip
        args = args_of[i]
        if known_of[i]:  # its ids' set kept (its values shared)
            gpu_args[gpu] = args
        elif args is not None and args.collective is not ABSENT:
            gpu_args[gpu] = _kept_by_text(shared(args), None, texts_of[i], kernel_texts)
    # a scope's or an annotation's arguments, per thread in their order
    noted = annotation[at]
    scoped = is_kept & ~found & (noted | ((name_flags & PARAMS) != 0))
    texts = batch.memo.texts
    no_args: Args | None = None  # shared(NO_ARGS): the same every time (SharedArgs keeps sets)
    tids = _tids(rows)
    ops: dict[str, str] = {}
    for i, start, end, is_note in zip(
        np.flatnonzero(scoped).tolist(), t0[at[scoped]].tolist(), t1[at[scoped]].tolist(),
        noted[scoped].tolist(), strict=True,
    ):  # fmt: skip
        args = args_of[i]
        if args is None:
            args = no_args = shared(NO_ARGS) if no_args is None else no_args
        elif not known_of[i]:
            args = _kept_by_text(shared(args), args, texts_of[i], texts)
        if is_note:
            op = ops.get(names[i])
            if op is None:
                op = ops[names[i]] = names[i][5:]  # after `nccl:`; one object an op
            scan.annotations[tids[i]].append((start, end, op, args))
        else:
            scan.params[tids[i]].append((start, end, args))
    # a gloo or c10d op (an operator's times and a launch are taken as columns)
    by_name = is_kept & ~found & ~scoped & ((name_flags & KEPT_BY_NAME) != 0)
    by_name &= ((cat_flags & CPU_OP) == 0) | ((name_flags & ENQUEUE) != 0)
    by_name &= (cat_flags & LAUNCH) == 0
    for i in np.flatnonzero(by_name).tolist():
        cat_code = int(rows[i, CAT])
        args = args_of[i]
        one_pass.keep_named(scan.out, names[i], strings[cat_code] if cat_code >= 0 else None,
                            int(t0[at[i]]), int(t1[at[i]]), tids[i],
                            NO_ARGS if args is None else args)  # fmt: skip


def _kept_by_text(
    found: Args, decoded: Args | None, text: bytes | None, texts: dict[bytes, Args]
) -> Args:
    """`found` (SharedArgs' set for `decoded`), kept for `text` where SharedArgs keeps it
    (it is not `decoded` itself: an equal set was kept before; a kernel's, `decoded` None:
    its values are), within MAX_TEXTS."""
    if text is not None and found is not decoded and len(texts) < MAX_TEXTS:
        texts[text] = found
    return found


def _raw_ts(batch: ScannedBatch, row: int) -> int | float:
    """An event's `ts` as msgspec decodes it: an int, or the float of a fraction."""
    if batch.rows[row, TS_KIND] == INT:
        return int(batch.rows[row, TS])
    return float(batch.times[row, F_TS])


def _texts(strings: list[str], codes: np.ndarray) -> list[str]:
    """The strings of codes (-1: an absent or null name, read as "")."""
    return list(map([*strings, ""].__getitem__, codes.tolist()))  # -1: the last


def _tids(rows: np.ndarray) -> list[int | None]:
    if rows[:, TID_KIND].all():  # every event writes its thread (as an int)
        return rows[:, TID].tolist()
    kinds, tids = rows[:, TID_KIND].tolist(), rows[:, TID].tolist()
    return [t if k else None for k, t in zip(kinds, tids, strict=True)]


def _id_or_none(rows: np.ndarray, kind: int, has_args: np.ndarray) -> bytes:
    """A kernel's correlation or stream as the converter keeps it: the id where it is an int
    below MAX_ARG_INTEGER, else -1."""
    ids = rows[:, kind + 1]
    ok = has_args & (rows[:, kind] == INT) & (ids >= 0) & (ids < MAX_ARG_INTEGER)
    return np.where(ok, ids, -1).astype(np.int64).tobytes()


def _add_device(
    device: DeviceScan,
    strings: list[str],
    rows: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    correlation: np.ndarray,
    stream: np.ndarray,
    mask: np.ndarray,
) -> None:
    at = np.flatnonzero(mask)
    if not len(at):
        return
    events, labels = device.device, device.labels
    events.ts.frombytes(ts[at].tobytes())
    events.dur.frombytes(dur[at].tobytes())
    events.correlation += correlation[at].tolist()
    events.name += [labels.setdefault(n, n) for n in _texts(strings, rows[at, NAME])]
    kinds = [c[:MAX_LABEL_CHARS] for c in _texts(strings, rows[at, CAT])]
    events.kind += [labels.setdefault(k, k) for k in kinds]
    events.stream += stream[at].tolist()


def _add_cpu_ops(
    cpu_ops: dict, rows: np.ndarray, t0: np.ndarray, t1: np.ndarray, at: np.ndarray
) -> None:
    """The operators' times appended to their threads' columns, threads in the order they
    first occur (the loop's order of the dict's keys)."""
    if not len(at):
        return
    known = rows[at, TID_KIND] == INT
    place = np.flatnonzero(known)  # a group a thread, then one for operators without one
    distinct, first, inverse = np.unique(
        rows[at[place], TID], return_index=True, return_inverse=True
    )
    keys: list[int | None] = list(distinct.tolist())
    group = np.full(len(at), len(keys), dtype=np.int64)
    group[place] = inverse
    firsts = place[first].tolist()
    if not known.all():
        keys.append(None)
        firsts.append(int(np.flatnonzero(~known)[0]))
    for index in np.argsort(firsts, kind="stable").tolist():
        ops = cpu_ops.get(keys[index])
        if ops is None:
            ops = cpu_ops[keys[index]] = (array("q"), array("q"))
        picked = at[group == index]
        ops[0].frombytes(t0[picked].tobytes())
        ops[1].frombytes(t1[picked].tobytes())
