"""The one loop over a trace's decoded events, a batch at a time (issue 43): what the
converter (`convert.Scan`) and the device time (`device.DeviceScan`) take of each event, and
the argument sets kept as one object (`files.SharedArgs.one`), in one pass. Both readers use
it: the streamed one batch by batch, the whole-file one over every event at once.

It replaced three loops, each reading the event's fields and checking their types again; it
was proved to add exactly what they added (the same lists, dicts and arrays, in the same
order) on every real trace, simulated folders and random events, and that state is recorded
(tests/unit/test_kineto_one_pass.py: against the record, and against invariants of what it
keeps). What it does once where they did it each:
- an argument set is shared (`SharedArgs.one`) only where the converter keeps it (a
  `record_param_comms`, an `nccl:` annotation, a kernel's collective arguments): sharing
  saves memory and changes nothing read, and the sets of other events are dropped anyway;
- a field is read from the event once (locals), its type tested once where both tested it.
The hot loop of a trace load: plain type checks and local names, no regex unless the name
can be a step.

(Taking the events as columns instead, numpy over attribute lists, was measured: 1.3x on
the simulated folders' comm-heavy traces but 0.8x on the 216k-event real trace, since
building the columns costs about what these loops cost.)
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from typing import Any

from diag.contract.limits import MAX_ARG_INTEGER, MAX_LABEL_CHARS, MAX_STEP
from diag.read.kineto.convert import (
    DEVICE_OF_CATEGORY,
    GPU_CATEGORIES,
    LAUNCH_CATEGORIES,
    LEGACY_CATEGORIES,
    MAX_TIME_US,
    NO_ARGS,
    NS_PER_US,
    PROFILER_RANGE,
    PROFILER_RANGE_SKIPPED,
    STEP_NAME,
    RankEvents,
    Scan,
    correlation_of,
)
from diag.read.kineto.device import STEP_START, DeviceScan, number_of
from diag.read.kineto.events import ABSENT, Args, Kept
from diag.read.kineto.host_calls import LOADER_PREFIX, WATCHED

SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})
"""CUDA synchronisation events on the device: a device event without a correlation id."""
STEP_OR_ENQUEUE = ("c10d::", "record_param_comms", "ProfilerStep")
KEPT_BY_NAME = ("ProfilerStep", "gloo:", "c10d::")
"""The host events `keep_named` keeps, by the start of their names."""


def take(
    events: list[Kept], scan: Scan, device: DeviceScan, shared: Callable[[Args], Args]
) -> None:
    """The converter's and the device time's parts of `events` added to `scan` and `device`
    (the module's docstring); `shared`: an argument set as the one kept for its values
    (`files.SharedArgs.one`)."""
    out, params = scan.out, scan.params
    gpu_name, gpu_category = out.gpu_name, out.gpu_category
    gpu_t0, gpu_t1, gpu_correlation = out.gpu_t0, out.gpu_t1, out.gpu_correlation
    gpu_stream = out.gpu_stream
    cpu_ops, launches, labels = out.cpu_ops, out.launches, scan.labels
    gpu_args, annotations = out.gpu_args, scan.annotations
    cpu_start: array = device.cpu_start
    cpu_correlation = device.cpu_correlation
    step_starts, device_labels = device.step_starts, device.labels
    on_device = device.device  # a column each (device_arrays.DeviceEvents)
    device_ts, device_dur, device_correlation = (
        on_device.ts.append, on_device.dur.append, on_device.correlation.append
    )  # fmt: skip
    device_names, device_kinds, device_streams = (
        on_device.name.append, on_device.kind.append, on_device.stream.append
    )  # fmt: skip
    host_call = device.host.add
    isfinite = math.isfinite
    whole_us = device.whole_us
    cpu_first, cpu_last = [], []
    other_devices = out.other_devices
    for event in events:
        ts, duration, category, name, args = (
            event.ts, event.dur, event.cat, event.name, event.args
        )  # fmt: skip
        if type(category) is str and category in LEGACY_CATEGORIES:  # any JSON value can come
            if category in DEVICE_OF_CATEGORY:  # an MTIA's: its device named
                other_devices.add(DEVICE_OF_CATEGORY[category])
            category = LEGACY_CATEGORIES[category]
        ts_int = type(ts) is int
        ts_finite = ts_int or (type(ts) is float and isfinite(ts))
        dur_int = type(duration) is int
        timed = dur_int or (type(duration) is float and isfinite(duration))
        # ---- the device time's (DeviceScan): every event, whatever its phase
        if not ts_int:
            whole_us = False
        if (
            ts_finite and timed and category is not None and category != "Trace"
            and -MAX_TIME_US < ts < MAX_TIME_US and -MAX_TIME_US < duration < MAX_TIME_US
        ):  # fmt: skip
            if args:
                stream, correlation = args.stream, args.correlation
                if type(stream) is not int:
                    stream = -1 if stream is ABSENT else number_of(stream)
                if type(correlation) is not int:  # hashable: a key of the launch count
                    correlation = -1 if correlation is ABSENT else number_of(correlation)
            else:
                stream = correlation = -1
            device_name = name if type(name) is str else ""
            if (stream >= 0 and correlation >= 0) or device_name in SYNC_NAMES:
                if stream >= 0:
                    kind = str(category)[:MAX_LABEL_CHARS]
                    device_ts(ts)
                    device_dur(duration)
                    device_correlation(correlation)
                    kind = device_labels.setdefault(kind, kind)
                    device_names(device_labels.setdefault(device_name, device_name))
                    device_kinds(kind)
                    device_streams(stream)
            else:
                if device_name in WATCHED or device_name.startswith(LOADER_PREFIX):
                    host_call(ts, duration, device_name)
                cpu_start.append(ts)
                cpu_correlation.append(correlation)
                if device_name.startswith("ProfilerStep") and STEP_START.match(device_name):
                    step_starts[device_name] = max(ts, step_starts.get(device_name, ts))
        # ---- the converter's (Scan): complete events with a time
        if event.ph != "X" or not ts_finite:
            continue
        if not -MAX_TIME_US < ts < MAX_TIME_US or (
            timed and not -MAX_TIME_US < duration < MAX_TIME_US
        ):
            out.skipped["a time or duration beyond ±2**61 ns"] += 1
            continue
        if timed and duration < 0:
            out.skipped["negative duration"] += 1
            continue
        t0 = ts * NS_PER_US if ts_int else round(ts * NS_PER_US)
        if dur_int:
            t1 = t0 + duration * NS_PER_US
        else:
            t1 = t0 + round(duration * NS_PER_US) if timed else t0
        if type(category) is not str:
            category = None
        if type(name) is not str:
            name = str(name) if type(name) is int or type(name) is float else ""
        tid = event.tid
        if type(tid) is list or type(tid) is dict:
            tid = None
        if args is None:
            args = NO_ARGS
        if category in GPU_CATEGORIES:
            gpu_name.append(labels.setdefault(name, name))
            gpu_category.append(labels.setdefault(category, category))
            # newer Kineto copies the collective's metadata onto its kernel
            gpu_args.append(shared(args) if args.collective is not ABSENT else None)
            gpu_t0.append(t0)
            gpu_t1.append(t1)
            correlation = args.correlation
            gpu_correlation.append(
                correlation if type(correlation) is int and 0 <= correlation < MAX_ARG_INTEGER
                else correlation_of(correlation)
            )  # fmt: skip
            stream = args.stream
            gpu_stream.append(
                stream if type(stream) is int and 0 <= stream < MAX_ARG_INTEGER else -1
            )
            continue
        if category == PROFILER_RANGE:  # no host work and no timeline: said, not read
            out.skipped[PROFILER_RANGE_SKIPPED] += 1
            continue
        cpu_first.append(t0)
        cpu_last.append(t1)
        if name.startswith("nccl:") and category != "gpu_user_annotation":
            # `nccl:<op>` (record_function around the launch): the op on older traces
            annotations[tid].append((t0, t1, name[5:], shared(args)))
        elif category == "cpu_op" and not name.startswith(STEP_OR_ENQUEUE):
            ops = cpu_ops.get(tid)  # c10d ops only enqueue; a legacy step is an `Operator`
            if ops is None:
                ops = cpu_ops[tid] = (array("q"), array("q"))
            ops[0].append(t0)
            ops[1].append(t1)
        elif category in LAUNCH_CATEGORIES:
            if category in DEVICE_OF_CATEGORY:  # an Intel GPU's, a PrivateUse1 backend's
                other_devices.add(DEVICE_OF_CATEGORY[category])
            correlation = args.correlation
            if type(correlation) is int and 0 <= correlation < MAX_ARG_INTEGER:
                launches[correlation] = (tid, t0)
            elif correlation is not ABSENT:
                launches[correlation_of(correlation)] = (tid, t0)
        elif name.startswith(KEPT_BY_NAME):
            keep_named(out, name, category, t0, t1, tid, args)
        if name == "record_param_comms":
            params[tid].append((t0, t1, shared(args)))
    device.whole_us = whole_us
    if cpu_first:
        first, last = min(cpu_first), max(cpu_last)
        out.cpu_t0 = first if out.cpu_t0 is None else min(out.cpu_t0, first)
        out.cpu_t1 = last if out.cpu_t1 is None else max(out.cpu_t1, last)


def keep_named(
    out: RankEvents, name: str, category: str | None, t0: int, t1: int, tid: Any, args: Args
) -> None:
    """A host event named from KEPT_BY_NAME kept where the converter reads it: a step, a gloo
    op, a c10d op (the last of `take`'s branches; scanned.py's events taken as columns too)."""
    if name.startswith("ProfilerStep") and category != "gpu_user_annotation":
        if step := STEP_NAME.match(name):
            if int(step.group(1)) >= MAX_STEP:
                out.skipped["step number beyond 2**40"] += 1
                return
            out.steps.append((int(step.group(1)), t0, t1))
            out.step_tid = tid
    elif name.startswith("gloo:"):
        # its arguments: the shapes its bytes are read from (gloo_sizes.py)
        out.gloo.append((name.removeprefix("gloo:")[:MAX_LABEL_CHARS], t0, t1, tid, args))
    elif name.startswith("c10d::") and category == "cpu_op":  # the op gloo runs
        out.c10d.append((name[6:MAX_LABEL_CHARS], t0, args))
