"""One rank's Kineto events as run-directory records, so the metrics, rules, reports and the
dashboard read a profiler trace as they read our own runs.

- steps: `ProfilerStep#N` on the CPU; a step's window on the device runs from the first to the
  last end of the GPU work its CPU step launched (matched by correlation id), opened back to
  the previous step's end (`_chain_device_windows`; where they overlapped, each span is the
  step whose window holds it: `_spans_by_device_time`); a
  kernel whose launch the trace lacks is its stream's previous launched kernel's step, or no
  step before the first (`_unlaunched_by_stream_order`). A CPU-only trace keeps the CPU
  window. No `ProfilerStep` at all: the whole trace is step 0.
- spans: computation kernels (phase `kernel`) and memory copies/sets (phase `memcpy`) are the
  device's busy time.
- comms: each op a communication kernel runs (a batch's kernel runs several), with op, group,
  bytes, dtype, peer and seq read from the CPU side that launched it (comm_ops.py: its
  `record_param_comms`, the batch recorded before its launch, its `nccl:<op>` annotation), else
  the op read from the kernel's name and no bytes (DeepEP). A collective's kernel queued behind
  another communication kernel starts at its arrival, not at the kernel's start (queued.py).
- comm_wait spans: the time of launched communication not hidden under computation or copies
  (exposed); a receive, and a collective under which the device computes nothing, are waits of
  their own (blocking) and have none.
Times are Kineto's microseconds turned into integer nanoseconds.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from diag.contract import schema
from diag.contract.limits import (
    MAX_ABS_TIME_NS,
)
from diag.numeric import intervals
from diag.read.kineto import step_bands
from diag.read.kineto.batches import KERNEL_KEY, RESUME_KEY
from diag.read.kineto.comm_ops import OP_BY_COLLECTIVE, CommAttribution, count, number_in_group
from diag.read.kineto.events import Args
from diag.read.kineto.gloo_sizes import message_bytes
from diag.read.kineto.kernels import KernelClass, KernelPatterns
from diag.read.kineto.queued import MESSAGE_OPS, queued_arrivals

NS_PER_US = 1000
MAX_TIME_US = MAX_ABS_TIME_NS / NS_PER_US / 2
"""Kineto times and durations (us) beyond this are skipped: start plus duration, in ns, stays within
diag/contract/limits.py's bound on times."""
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({
    "cuda_runtime", "cuda_driver", "hip_runtime",
    "xpu_runtime", "xpu_driver",  # Intel GPUs (urEnqueueKernelLaunch ...)
    "privateuse1_runtime", "privateuse1_driver",  # out-of-tree backends through PrivateUse1
})  # fmt: skip
"""Kineto's categories of the host calls that launch device work (tied to it by correlation)."""
PROFILER_RANGE = "cuda_profiler_range"
"""CUPTI's range profiler: a kernel replayed, serialised, to count its instructions; its
event's time is the measurement's, not the kernel's place in a timeline."""
PROFILER_RANGE_SKIPPED = "CUPTI range profiler counters: kernels replayed to count, no timeline"
LEGACY_CATEGORIES = {
    "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
    "Runtime": "cuda_runtime", "Operator": "cpu_op",
    "mtia_ccp_events": "kernel", "mtia_runtime": "cuda_runtime",
}  # fmt: skip
"""Kineto's categories read as today's CUDA ones: those before PyTorch 1.9 (2021: `Kernel`,
`Operator`), and MTIA's device work and its launches (`mtia_ccp_events`, `mtia_runtime`,
tied by correlation as a CUDA kernel and its launch are)."""
DEVICE_OF_CATEGORY = {
    "mtia_ccp_events": "mtia", "mtia_runtime": "mtia",
    "xpu_runtime": "xpu", "xpu_driver": "xpu",
    "privateuse1_runtime": "privateuse1", "privateuse1_driver": "privateuse1",
}  # fmt: skip
"""The device whose work a category read as CUDA's is (the manifest's `device_type`)."""
STEP_NAME = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
NO_ARGS = Args()
"""An event without arguments reads as one whose every argument is absent."""


@dataclass
class RankEvents:
    """The parts of one rank's trace the analysis uses (times in ns)."""

    gpu_name: list[str] = field(default_factory=list)
    gpu_category: list[str] = field(default_factory=list)
    # int64 columns, not lists of ints (a number object each: about 64 bytes a kernel more);
    # every value is bounded: times by MAX_TIME_US, ids and streams by MAX_ARG_INTEGER or -1
    gpu_t0: array = field(default_factory=lambda: array("q"))
    gpu_t1: array = field(default_factory=lambda: array("q"))
    gpu_correlation: array = field(default_factory=lambda: array("q"))
    gpu_stream: array = field(default_factory=lambda: array("q"))  # -1: the trace does not say
    gpu_args: list[Args | None] = field(default_factory=list)  # a kernel's own collective args
    launches: dict[int, tuple[Any, int]] = field(default_factory=dict)  # corr -> (tid, t0)
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (step, t0, t1) on the CPU
    params: dict[Any, list[tuple[int, int, Args]]] = field(default_factory=dict)
    param_starts: dict[Any, list[int]] = field(default_factory=dict)  # per thread, sorted
    # `nccl:<op>` annotations per thread, by start: (t0, t1, op as named, args)
    annotations: dict[Any, list[tuple[int, int, str, Args]]] = field(default_factory=dict)
    cpu_ops: dict[Any, tuple[array, array]] = field(default_factory=dict)  # tid -> t0s, t1s
    # `gloo:*` events: (op, t0, t1, tid, args); c10d ops issued: (name, t0, args)
    gloo: list[tuple[str, int, int, Any, Args]] = field(default_factory=list)
    c10d: list[tuple[str, int, Args]] = field(default_factory=list)
    step_tid: Any = None  # the thread that runs the steps
    cpu_t0: int | None = None
    cpu_t1: int | None = None
    skipped: Counter[str] = field(default_factory=Counter)  # events left out, by reason
    comm_sources: dict[str, int] = field(default_factory=dict)  # comm kernels by how read
    # the devices other than CUDA's whose events were read as CUDA's (DEVICE_OF_CATEGORY)
    other_devices: set[str] = field(default_factory=set)


class Scan:
    """The converter's part of a trace's complete ('X') events, gathered a batch at a time as
    the file is read (diag/read/kineto/stream.py) by the one loop over the events
    (one_pass.take, which fills the device time's `DeviceScan` beside it)."""

    def __init__(self) -> None:
        self.out = RankEvents()
        self.params: dict[Any, list[tuple[int, int, Args]]] = defaultdict(list)
        self.labels: dict[str, str] = {}  # one object for each kernel name and category
        self.annotations: dict[Any, list[tuple[int, int, str, Args]]] = defaultdict(list)

    def result(self) -> RankEvents:
        """The events added, with the launches' arguments and the steps in time order."""
        out = self.out
        out.params = {tid: sorted(rows, key=lambda r: r[0]) for tid, rows in self.params.items()}
        out.param_starts = {tid: [r[0] for r in rows] for tid, rows in out.params.items()}
        out.annotations = {
            tid: sorted(rows, key=lambda r: r[0]) for tid, rows in self.annotations.items()
        }
        out.steps.sort(key=lambda s: s[1])
        return out


def correlation_of(value: Any) -> int:
    """A correlation id as an int (-1: none, or not a usable integer)."""
    number = count(value, default=-1)
    return number if number >= 0 else -1


COMM, MEMORY = KernelClass.COMM.value, KernelClass.MEMORY.value
RECV, SEND = schema.CollectiveOp.RECV.value, schema.CollectiveOp.SEND.value
MEMCPY, KERNEL = schema.Phase.MEMCPY.value, schema.Phase.KERNEL.value
COMM_WAIT = schema.Phase.COMM_WAIT.value


def _step_of(times: np.ndarray, steps: list[tuple[int, int, int]]) -> np.ndarray:
    """The ProfilerStep whose CPU window holds each time; -1 outside every window."""
    if not steps:
        return np.zeros(len(times), dtype=np.int64)
    starts = np.array([s[1] for s in steps])
    ends = np.array([s[2] for s in steps])
    numbers = np.array([s[0] for s in steps])
    index = np.searchsorted(starts, times, side="right") - 1
    inside = (index >= 0) & (times < ends[np.clip(index, 0, None)])
    return np.where(inside, numbers[np.clip(index, 0, None)], -1)


def _unlaunched_by_stream_order(
    steps: np.ndarray, has_launch: np.ndarray, t0: np.ndarray, streams: np.ndarray
) -> np.ndarray:
    """The steps of kernels whose launch the trace lacks, from their stream's order rather
    than from their own start: the step of the last kernel with a launch before them on their
    stream; none before them: launched before the trace began (-1, in no step). A GPU running
    behind its CPU runs, at the window's start, work launched before it: read by its start
    time, a real job's first steps took 968 such kernels, 32 ms more each. A stream with no
    launch at all (a trace without runtime events) keeps the steps its starts give."""
    if has_launch.all() or not has_launch.any():
        return steps
    # every stream's kernels in start order, one stream after another (one sort: a trace may
    # hold as many streams as kernels)
    order = np.lexsort((t0, streams))
    in_order, launched = streams[order], has_launch[order]
    position = np.arange(len(order))
    first = np.flatnonzero(np.r_[True, in_order[1:] != in_order[:-1]])  # each stream's start
    stream_start = np.repeat(first, np.diff(np.r_[first, len(order)]))
    # the position of the last launched kernel so far (of this stream where it is not before
    # the stream's start), and whether the stream has any launched kernel at all
    last = np.maximum.accumulate(np.where(launched, position, -1))
    before = last >= stream_start
    any_launched = np.repeat(
        np.maximum.reduceat(launched, first), np.diff(np.r_[first, len(order)])
    )
    change = ~launched & any_launched
    found = np.where(before, steps[order[np.maximum(last, 0)]], -1)
    steps = steps.copy()
    steps[order[change]] = found[change]
    return steps


def to_records(rank_id: int, rank: RankEvents, patterns: KernelPatterns) -> dict[str, list[dict]]:
    """Step, span (kernel, memcpy, comm_wait) and comm records of one rank."""
    records: dict[str, list[dict]] = {"step": [], "span": [], "comm": []}
    t0 = np.array(rank.gpu_t0, dtype=np.int64)
    t1 = np.array(rank.gpu_t1, dtype=np.int64)
    correlation = np.array(rank.gpu_correlation, dtype=np.int64)
    kinds = patterns.classify(rank.gpu_name, rank.gpu_category)
    launches = [rank.launches.get(c) for c in rank.gpu_correlation]  # None: not in the trace
    has_launch = np.array([launch is not None for launch in launches], dtype=bool)
    launched_at = np.array(
        [
            t if launch is None else launch[1]
            for launch, t in zip(launches, rank.gpu_t0, strict=True)
        ],
        dtype=np.int64,
    )
    steps = _step_of(launched_at, rank.steps)
    steps = _unlaunched_by_stream_order(
        steps, has_launch, t0, np.array(rank.gpu_stream, dtype=np.int64)
    )
    if len(t0) == 0:
        return _cpu_records(rank_id, rank)
    attribution = CommAttribution(rank)
    attribution.prepare(np.flatnonzero(kinds == COMM), correlation)
    # a collective's kernel queued behind another's (a stream's order) arrived before it
    # started (queued.py); a message's kernel keeps its start (its peer's pairs with it)
    arrived = queued_arrivals(
        t0,
        t1,
        launched_at,
        np.flatnonzero(kinds == COMM),
        np.flatnonzero(kinds != COMM),
        np.array(rank.gpu_stream, dtype=np.int64),
    )
    starts = t0.copy()  # each comm kernel's start as recorded: its arrival or its own start
    ends, correlations = rank.gpu_t1, rank.gpu_correlation
    t0_list, arrived_list = rank.gpu_t0, arrived.tolist()  # read one by one below: lists
    order = np.argsort(steps, kind="stable")  # each step's kernels, in trace order
    numbers, firsts = np.unique(steps[order], return_index=True)
    groups = [
        (number, mine)
        for number, mine in zip(numbers.tolist(), np.split(order, firsts[1:]), strict=True)
        if number != -1
    ]
    # every step's computation, covered times and waits measured at once (step_bands.py)
    is_comm = kinds == COMM
    banded = step_bands.bands(t0, t1, arrived, [mine for _, mine in groups])
    shift = banded.shift
    banded_t0, banded_t1, banded_arrived = t0 + shift, t1 + shift, arrived + shift
    covered = step_bands.Covered.none(len(t0))
    for _, kernels in banded.sets:  # one set; a step a set where the bands do not fit
        busy, comm = kernels[~is_comm[kernels]], kernels[is_comm[kernels]]
        covered.add(banded_t0, banded_t1, banded_arrived, busy, comm)
    hidden_of = covered.hidden_ns.tolist()
    since_arrival_of = covered.hidden_since_arrival_ns.tolist()
    waited_of = covered.waited.tolist()
    own_wait_of = np.zeros(len(t0), dtype=bool)
    unawaited_of = np.zeros(len(t0), dtype=bool)  # sends the rank did not wait for: no comm_wait
    busy_of_step = []
    for number, mine in groups:
        records["step"].append(
            {"rank": rank_id, "step": number, "t0": int(t0[mine].min()), "t1": int(t1[mine].max())}
        )
        busy = mine[~is_comm[mine]]
        busy_of_step.append(busy)
        busy_starts: np.ndarray | None = None  # sorted, where a batch asks
        for i in mine[is_comm[mine]].tolist():
            hidden_ns, since_arrival = hidden_of[i], since_arrival_of[i]
            # A receive is its own wait: what consumes the message waits on its stream, and
            # the replay pairs it with its send. So is a collective under which the device
            # computes nothing: the stream that needs its result waits for it (a TP
            # all-reduce). Others are launched and awaited where their time is exposed. A
            # batch's kernel is one wait: a receive among its ops makes it blocking; a send (as
            # its launch names it) only where the rank waited for it (send_waits.py).
            ops = attribution.describe(i, correlations[i])
            if len(ops) == 1:  # most kernels: one op
                op = ops[0]["op"]
                receives, sends, message = op == RECV, op == SEND, op in MESSAGE_OPS
            else:
                receives = any(d["op"] == RECV for d in ops)
                sends = bool(ops) and all(d["op"] == SEND for d in ops)
                message = any(d["op"] in MESSAGE_OPS for d in ops)
            # (only where the device computed while it queued: a collective launched ahead of
            # a blocked computation, a tensor-parallel one, arrived when its stream got to it)
            start = t0_list[i]  # each comm kernel's start as recorded: its arrival or its own
            if ops and not message and arrived_list[i] < start and since_arrival > hidden_ns:
                start, hidden_ns = arrived_list[i], since_arrival
                starts[i] = start
            own_wait = receives or (hidden_ns <= 0 and (not sends or waited_of[i]))
            own_wait_of[i] = own_wait
            unawaited_of[i] = sends and not own_wait and not waited_of[i]
            # a batch's ops get their own ends from their peers' once every rank is read
            # (batches.py): which kernel ran them, and when the computation resumed after it
            end = ends[i]
            if len(ops) < 2:
                batch = {}
            else:
                busy_starts = np.sort(t0[busy]) if busy_starts is None else busy_starts
                batch = {KERNEL_KEY: i, RESUME_KEY: _next(busy_starts, t0_list[i])}
            for described in ops:
                records["comm"].append({
                    "rank": rank_id, "step": number, **described, "t0": start,
                    "t1": end, "expected_bytes": None, "tag": None,
                    "async": not own_wait, "blocking": own_wait, **batch,
                })  # fmt: skip
    # exposed: neither computing nor in a collective that is its own wait (that time is the
    # collective's record already; a comm_wait there would count it twice)
    awaited_of = is_comm & ~own_wait_of & ~unawaited_of
    occupied_of = ~is_comm | own_wait_of
    waits_of_step: dict[int, list[list[int]]] = {}
    for places, kernels in banded.sets:
        awaited, occupied = kernels[awaited_of[kernels]], kernels[occupied_of[kernels]]
        exposed = intervals.difference(
            np.column_stack([starts[awaited] + shift[awaited], banded_t1[awaited]]),
            np.column_stack([banded_t0[occupied], banded_t1[occupied]]),
        )
        waits_of_step.update(banded.unbanded(exposed, places))
    for place, ((number, _), busy) in enumerate(zip(groups, busy_of_step, strict=True)):
        records["span"] += [
            {"rank": rank_id, "step": number, "mb": None, "phase": MEMCPY if kind == MEMORY
             else KERNEL, "stage": None, "chunk": None, "t0": start, "t1": end}
            for kind, start, end in zip(
                kinds[busy].tolist(), t0[busy].tolist(), t1[busy].tolist(), strict=True
            )
        ]  # fmt: skip
        for start, end in waits_of_step.get(place, []):
            records["span"].append(_span(rank_id, number, COMM_WAIT, start, end))
    rank.comm_sources = attribution.counts
    number_in_group(records["comm"])
    if _chain_device_windows(records["step"]):
        _spans_by_device_time(records["span"], records["step"])
    return records


def _chain_device_windows(steps: list[dict[str, Any]]) -> bool:
    """Each step's device window opened back to the previous step's end (its steps in order,
    the previous one's number just before, ending before it): on a device that runs its steps
    one after another, a step is the time from the last one's end to its own, as the host's
    iteration counts it. True where some window overlapped the one before it.

    - A gap: the device idled waiting for this step's first launch (its host loading data, a
      slow launch). Read from the first to the last kernel alone, a job whose loader stalls at
      each step's start read 117 ms steps for its 154 ms iterations.
    - An overlap: a GPU running behind its CPU runs the next step's copies or side-stream
      kernels, launched early, while its main stream is still on this step. Read from the
      first to the last kernel, hta-alltoall-world16's 216 ms iterations read 374 ms."""
    ordered = sorted(steps, key=lambda step: step["step"])
    overlapped = False
    for before, after in pairwise(ordered):
        if after["step"] == before["step"] + 1 and after["t1"] > before["t1"]:
            overlapped = overlapped or after["t0"] < before["t1"]
            after["t0"] = before["t1"]
    return overlapped


def _spans_by_device_time(spans: list[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
    """Each span is the step whose device window holds its start, where the windows overlapped
    (`_chain_device_windows`): a step's time breakdown is the device's time in its window, and
    a copy launched early for the next step runs inside this one. A span in no window keeps
    its launch's step. The collectives keep their launch's step: where a collective sits in
    its step (the layout's placement) is read from when it was issued."""
    ordered = sorted(steps, key=lambda step: step["t0"])
    starts = np.array([step["t0"] for step in ordered], dtype=np.int64)
    ends = np.array([step["t1"] for step in ordered], dtype=np.int64)
    numbers = [step["step"] for step in ordered]
    span_starts = np.array([span["t0"] for span in spans], dtype=np.int64)
    window = np.searchsorted(starts, span_starts, side="right") - 1
    for span, i in zip(spans, window.tolist(), strict=True):
        if i >= 0 and span["t0"] < ends[i]:
            span["step"] = numbers[i]


def _next(starts: np.ndarray, after: int) -> int | None:
    """The first of the sorted `starts` later than `after`; None where none is."""
    i = int(np.searchsorted(starts, after, side="right"))
    return int(starts[i]) if i < len(starts) else None


def _cpu_records(rank_id: int, rank: RankEvents) -> dict[str, list[dict]]:
    """A trace without GPU work (gloo on CPU): the step thread's operators are the busy time,
    `gloo:*` events the collectives. Most run on gloo's worker threads (c10d ops only enqueue
    them): asynchronous, their time not hidden under the step thread's operators is its
    `comm_wait`. One on the step thread itself during which that thread starts nothing else (a
    receive gloo runs in the caller) blocks it: its own interval is the wait. The thread's
    time between operators inside the step with nothing in flight is busy too
    (`_work_between_operators`)."""
    records: dict[str, list[dict]] = {"step": [], "span": [], "comm": []}
    op_starts, op_ends = rank.cpu_ops.get(rank.step_tid, ((), ()))
    ops = np.array(list(zip(op_starts, op_ends, strict=True))).reshape(-1, 2)
    gloo = np.array([event[1:3] for event in rank.gloo], dtype=np.int64).reshape(-1, 2)
    on_step_thread = np.array(
        [rank.step_tid is not None and event[3] == rank.step_tid for event in rank.gloo],
        dtype=bool,
    )
    # it blocks only if the thread did nothing else meanwhile: gloo records an asynchronous
    # send on the caller too, and the caller goes on (its next receive starts inside)
    thread_starts = np.sort(np.concatenate([ops[:, 0], gloo[on_step_thread, 0]]))
    after_start = np.searchsorted(thread_starts, gloo[:, 0], side="right")
    before_end = np.searchsorted(thread_starts, gloo[:, 1], side="left")
    idle_meanwhile = before_end <= after_start
    on_step_thread &= idle_meanwhile
    # so does one on a worker that the step thread awaits inside an operator of its own (a
    # synchronous `c10d::allreduce_`): the operator's time meanwhile is waiting, not work
    awaited_in_op = ~on_step_thread & idle_meanwhile & _inside_operators(ops, gloo)
    on_step_thread |= awaited_in_op
    issued_as = gloo_ops(rank)
    sizes = [
        message_bytes(op, event[4], issuer)
        for (op, issuer), event in zip(issued_as, rank.gloo, strict=True)
    ]
    for number, s0, s1 in rank.steps or _whole_trace(rank):
        records["step"].append({"rank": rank_id, "step": number, "t0": s0, "t1": s1})
        operators = intervals.merge(intervals.clip(ops, s0, s1))
        operators = intervals.difference(operators, gloo[awaited_in_op])
        # A collective is the step's that issued it: the one its worker event starts in (one
        # that runs on past the step's end is cut there, never counted in the next step too).
        starts, ends = gloo[:, 0], np.minimum(gloo[:, 1], s1)
        inside = (starts >= s0) & (starts < s1) & (ends > starts)
        waited = inside & ~on_step_thread
        comm = np.column_stack([starts[waited], ends[waited]])
        blocked = np.column_stack([starts[inside & ~waited], ends[inside & ~waited]])
        busy = intervals.merge(
            np.concatenate([operators, _work_between_operators(operators, blocked, comm)])
        )
        for start, end in busy.tolist():
            records["span"].append(_span(rank_id, number, schema.Phase.KERNEL.value, start, end))
        for i, start, end in zip(
            np.flatnonzero(inside).tolist(), starts[inside].tolist(), ends[inside].tolist(),
            strict=True,
        ):  # fmt: skip
            op = issued_as[i][0]
            blocking = bool(on_step_thread[i])
            records["comm"].append({
                "rank": rank_id, "step": number, "op": OP_BY_COLLECTIVE.get(op, op),
                "group": None, "group_size": None, "bytes": sizes[i][0], "dtype": sizes[i][1],
                "t0": start, "t1": end, "expected_bytes": None, "tag": None,
                "async": not blocking, "blocking": blocking,
            })  # fmt: skip
        # time in a blocking one is its own record's: no asynchronous one's comm_wait too
        occupied = intervals.merge(np.concatenate([busy, blocked]))
        for start, end in intervals.difference(comm, occupied).tolist():
            records["span"].append(_span(rank_id, number, schema.Phase.COMM_WAIT.value, start, end))
    return records


GLOO_RUNS_AS = {"reduce_scatter": "all_reduce", "barrier": "all_reduce"}
"""c10d ops gloo runs as another of its own (its `gloo:*` event named after that one)."""


def gloo_ops(rank: RankEvents) -> list[tuple[str, Args | None]]:
    """Each `gloo:*` event's op, named from the c10d op that issued it where that differs
    (`c10d::_reduce_scatter_base_` runs as `gloo:all_reduce`): the CPU side's operation, not
    the backend's, with that op's arguments (None where no c10d op took the event). Each c10d
    op, in issue order, takes the first event not yet taken that starts after it and that gloo
    runs it as; an event no c10d op takes keeps its own name."""
    names = [OP_BY_COLLECTIVE.get(event[0], event[0]) for event in rank.gloo]
    issuers: list[Args | None] = [None] * len(rank.gloo)
    if not rank.c10d or not rank.gloo:
        return list(zip(names, issuers, strict=True))
    order = sorted(range(len(rank.gloo)), key=lambda i: rank.gloo[i][1])
    taken = [False] * len(rank.gloo)
    for name, t0, args in sorted(rank.c10d, key=lambda c: c[1]):
        op = OP_BY_COLLECTIVE.get(name.strip("_"), OP_BY_COLLECTIVE.get(name.rstrip("_")))
        if op is None:
            continue
        runs_as = GLOO_RUNS_AS.get(op, op)
        for i in order:
            if not taken[i] and rank.gloo[i][1] >= t0 and names[i] in (op, runs_as):
                taken[i] = True
                names[i], issuers[i] = op, args
                break
    return list(zip(names, issuers, strict=True))


def _inside_operators(ops: np.ndarray, events: np.ndarray) -> np.ndarray:
    """Per (start, end) event, whether one operator of `ops` (start, end rows) spans it."""
    if len(ops) == 0 or len(events) == 0:
        return np.zeros(len(events), dtype=bool)
    order = np.argsort(ops[:, 0], kind="stable")
    starts, reach = ops[order, 0], np.maximum.accumulate(ops[order, 1])
    last_before = np.searchsorted(starts, events[:, 0], side="right") - 1
    return (last_before >= 0) & (reach[np.maximum(last_before, 0)] >= events[:, 1])


def _work_between_operators(
    operators: np.ndarray, blocked: np.ndarray, in_flight: np.ndarray
) -> np.ndarray:
    """The step thread's time between its first and last operator of a step in no operator, no
    collective it blocks in and with no collective in flight: the step's own host-side work
    (Python between operators, the model's host code, a sleep), which a run's `fwd`/`bwd`
    spans count as compute. Time before the first operator (a data fetch) and after the last
    stays in no record, the rank's host time. (start, end) rows."""
    if len(operators) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    between = np.array([[operators[0, 0], operators[-1, 1]]])
    return intervals.difference(between, np.concatenate([operators, blocked, in_flight]))


def _span(rank: int, step: int, phase: str, t0: Any, t1: Any) -> dict[str, Any]:
    return {"rank": rank, "step": step, "mb": None, "phase": phase, "stage": None,
            "chunk": None, "t0": int(t0), "t1": int(t1)}  # fmt: skip


def _whole_trace(rank: RankEvents) -> list[tuple[int, int, int]]:
    if rank.cpu_t0 is None or rank.cpu_t1 is None or rank.cpu_t1 <= rank.cpu_t0:
        return []
    return [(0, rank.cpu_t0, rank.cpu_t1)]
