"""A scanned batch's events (scanned.py) added to the converter's and the device time's state
as one_pass.take adds them: the columns by numpy, the kept arguments in passes by kind, the
events the scanner left to msgspec by one_pass.take itself, in their places (issue 43)."""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np

from diag.contract.limits import MAX_ARG_INTEGER, MAX_LABEL_CHARS
from diag.read.kineto import one_pass
from diag.read.kineto.convert import MAX_TIME_US, NO_ARGS, NS_PER_US, Scan
from diag.read.kineto.device import STEP_START, DeviceScan
from diag.read.kineto.events import ABSENT, Args
from diag.read.kineto.scan_columns import (
    ARGS,
    CAT,
    CORRELATION,
    CORRELATION_KIND,
    CPU_OP,
    DUR,
    DUR_KIND,
    ENQUEUE,
    F_DUR,
    F_TS,
    FLOAT,
    GPU,
    GPU_ANNOTATION,
    INT,
    KEPT_BY_NAME,
    LAUNCH,
    NAME,
    NCCL,
    PARAMS,
    PH,
    PH_X,
    STEP,
    STREAM,
    STREAM_KIND,
    SYNC,
    TID,
    TID_KIND,
    TRACE,
    TS,
    TS_KIND,
    WATCHED_CALL,
)
from diag.read.kineto.scan_memo import kept_by_text
from diag.read.kineto.scanned import ScannedBatch


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
            gpu_args[gpu] = kept_by_text(shared(args), None, texts_of[i], kernel_texts)
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
            args = kept_by_text(shared(args), args, texts_of[i], texts)
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
