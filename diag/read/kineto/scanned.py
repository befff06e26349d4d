"""A batch of a trace's events read as columns by the C scanner (`event_scan.c`, issue 43),
and taken by numpy where one_pass.take would read them one by one.

Decoding every event into a struct and then reading its fields in a Python loop was most of
a trace's parse (about 70% on a real 216k-event trace). The scanner reads the fields the
loop needs (ph, cat, name, ts, dur, tid, args' correlation and stream, whether args name a
collective) straight from the text, and:
- the events it reads exactly as msgspec does are taken as columns (`_take_columns` does with
  arrays what one_pass.take does with each: the device events, the host's calls and starts,
  the kernels, the operators' times, the launches). Those whose arguments or raw times the
  converter keeps (a step, a `record_param_comms` scope, an `nccl:` annotation, a collective
  kernel's own arguments, a gloo or c10d op) are decoded by msgspec too, and only those parts
  are taken one by one, in their order (`_own_args`), so argument sets are shared as before;
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
from dataclasses import dataclass

import numpy as np

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
from diag.read.kineto.events import ABSENT, BATCH_DECODER, DECODE_ERRORS, Args, Kept
from diag.read.kineto.host_calls import LOADER_PREFIX, WATCHED

try:
    import diag.read.kineto.event_scan as event_scan  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: msgspec reads every batch
    event_scan = None

AVAILABLE = event_scan is not None and os.environ.get("DIAG_EVENT_SCAN", "1") != "0"
"""The scanner reads the batches (else msgspec alone)."""

# the scanner's columns (event_scan.c's enum)
(KIND, START, END, PH, CAT, NAME, TS_KIND, TS, DUR_KIND, DUR, TID_KIND, TID, ARGS,
 CORRELATION_KIND, CORRELATION, STREAM_KIND, STREAM, COLLECTIVE, NCOL) = range(19)  # fmt: skip
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


@dataclass
class ScannedBatch:
    """A batch's events: the scanner's rows, the strings its codes name, and the events
    decoded by msgspec (those taken by the loop, and those whose arguments are kept), in
    order, with which rows they are."""

    rows: np.ndarray  # (events, NCOL) int64
    times: np.ndarray  # (events, 2) float64: ts and dur where they are fractions
    strings: list[str]
    flags: np.ndarray  # each string's flags (below), and 0 for code -1 (none) last
    by_loop: np.ndarray  # bool per event: taken by one_pass.take
    decoded: list[Kept]  # the events decoded, in order
    decoded_rows: np.ndarray  # their rows


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


def scan_batch(
    buffer: bytearray, first: int, end: int, known: dict[str, int]
) -> ScannedBatch | None:
    """buffer[first:end] (events separated by commas) read by the scanner; None where msgspec
    is to decode the whole batch (the scanner does not read it, or an event it leaves to
    msgspec does not decode: the whole batch's decoding then says why). `known`: the flags
    of the strings a trace's earlier batches held (filled here)."""
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
    with memoryview(buffer) as text:
        names = [bytes(text[a : a + n]).decode("ascii") for a, n in strings[:distinct].tolist()]
        for string in names:
            if string not in known:
                known[string] = _flags(string)
        flags = np.array([known[n] for n in names] + [0], dtype=np.int64)  # code -1: none
        cat, name = flags[rows[:, CAT]], flags[rows[:, NAME]]
        by_loop = (rows[:, KIND] == ODD) | (((cat | name) & BY_LOOP) != 0)
        own_args = ((name & OWN_ARGS) != 0) | (((cat & GPU) != 0) & (rows[:, COLLECTIVE] != 0))
        at = np.flatnonzero(by_loop | own_args)
        decoded: list[Kept] = []
        if len(at):
            spans = rows[at][:, [START, END]].tolist()
            try:
                decoded = BATCH_DECODER.decode(b"[" + b",".join(text[a:b] for a, b in spans) + b"]")
            except DECODE_ERRORS:
                return None
    return ScannedBatch(rows, times, names, flags, by_loop, decoded, at)


def take_scanned(
    batch: ScannedBatch, scan: Scan, device: DeviceScan, shared: Callable[[Args], Args]
) -> None:
    """The batch's events added to `scan` and `device` as one_pass.take adds them, in order:
    the runs of events the loop takes by it, the runs of others as columns (`_take_columns`)."""
    by_loop = batch.by_loop
    edges = np.flatnonzero(np.diff(by_loop.astype(np.int8))) + 1
    bounds = np.concatenate([[0], edges, [len(by_loop)]]).tolist()
    positions = np.searchsorted(batch.decoded_rows, bounds).tolist()  # into `decoded`
    for a, b, pa, pb in zip(bounds[:-1], bounds[1:], positions[:-1], positions[1:], strict=True):
        if by_loop[a]:
            one_pass.take(batch.decoded[pa:pb], scan, device, shared)
        else:
            _take_columns(batch, a, b, batch.decoded[pa:pb], scan, device, shared)


def _take_columns(
    batch: ScannedBatch,
    a: int,
    b: int,
    decoded: list[Kept],
    scan: Scan,
    device: DeviceScan,
    shared: Callable[[Args], Args],
) -> None:
    """Rows a..b-1 (none taken by the loop) added as one_pass.take adds them: with arrays,
    and the parts that keep an event's arguments (`decoded`: those events, in order) by
    `_own_args`."""
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
    if len(decoded):
        own = batch.decoded_rows
        own = own[(own >= a) & (own < b)] - a
        _own_args(own, decoded, rows, t0, t1, name_flags, cat_flags, kept, gpu_at, gpu_args,
                  annotation, timed_event & ~on_stream, scan, device, shared)  # fmt: skip
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
    own: np.ndarray,
    decoded: list[Kept],
    rows: np.ndarray,
    t0: np.ndarray,
    t1: np.ndarray,
    name_flags: np.ndarray,
    cat_flags: np.ndarray,
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
    their rows; `decoded`: the events), in their order, as it does: a collective kernel's
    arguments, a step's start and number, an annotation's or a scope's arguments, a gloo or
    c10d op (`one_pass.keep_named`)."""
    gpu_place = {row: place for place, row in enumerate(gpu_at.tolist())}
    step_starts = device.step_starts
    for row, event in zip(own.tolist(), decoded, strict=True):
        name, flags, args = event.name, int(name_flags[row]), event.args
        if on_host[row] and flags & STEP and STEP_START.match(name):
            step_starts[name] = max(event.ts, step_starts.get(name, event.ts))
        if not kept[row]:
            continue
        if args is None:
            args = NO_ARGS
        if row in gpu_place:
            if args.collective is not ABSENT:
                gpu_args[gpu_place[row]] = shared(args)
            continue
        start, end, tid = int(t0[row]), int(t1[row]), event.tid
        category = int(cat_flags[row])
        if annotation[row]:
            scan.annotations[tid].append((start, end, name[5:], shared(args)))
        elif (category & CPU_OP and not flags & ENQUEUE) or category & LAUNCH:
            pass  # an operator's times or a launch: taken as columns
        elif flags & KEPT_BY_NAME:
            one_pass.keep_named(scan.out, name, event.cat, start, end, tid, args)
        if flags & PARAMS:
            scan.params[tid].append((start, end, shared(args)))


def _texts(strings: list[str], codes: np.ndarray) -> list[str]:
    """The strings of codes (-1: an absent or null name, read as "")."""
    return [strings[c] if c >= 0 else "" for c in codes.tolist()]


def _tids(rows: np.ndarray) -> list[int | None]:
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
