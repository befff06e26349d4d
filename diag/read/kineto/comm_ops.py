"""Which operation a communication kernel runs, read from the CPU side that launched it.

A kernel's name says little: NCCL runs an all-to-all, and every batched send and receive, as
one `SendRecv` kernel. What the job asked for is on the CPU, in this order of trust:
1. the kernel's own arguments (newer Kineto copies the collective's metadata onto it);
2. the `record_param_comms` scope around its launch (matched by correlation id): `Collective
   name`, `In/Out msg nelems` x `dtype`, `Process Group Name/Description/Ranks`, the peer of a
   send (`Dst Rank`) or receive (`Src Rank`), `Seq`;
3. a batch: `batch_isend_irecv` records each op's scope and closes it before `ncclGroupEnd`
   launches the one kernel (pytorch/pytorch#194693, mlcommons/chakra#178), so the kernel
   carries every op recorded on its launching thread since that thread's previous
   communication launch: one record per op, each with the kernel's interval;
4. the `nccl:<op>` annotation around the launch (older traces: no arguments on
   `record_param_comms`): the op from its name, the bytes from `Input Dims` x `Input type`;
5. the kernel's name, as the last resort (DeepEP's kernels have nothing else).
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from diag.contract import schema
from diag.contract.limits import MAX_ARG_INTEGER, MAX_LABEL_CHARS, MAX_WORLD_SIZE
from diag.read.kineto.events import ABSENT, Args
from diag.read.kineto.kernels import op_from_kernel_name


class RankEvents(Protocol):
    """What the attribution reads of a rank's scanned events (convert.RankEvents)."""

    gpu_name: list[str]
    gpu_args: list[Args | None]
    launches: dict[int, tuple[Any, int]]  # correlation -> (thread, launch time)
    params: dict[Any, list[tuple[int, int, Args]]]  # record_param_comms per thread, by start
    param_starts: dict[Any, list[int]]
    annotations: dict[Any, list[tuple[int, int, str, Args]]]  # `nccl:<op>` per thread


DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "long": 8, "int64": 8, "long int": 8, "int": 4, "int32": 4, "short": 2,
    "int16": 2, "short int": 2, "char": 1, "byte": 1, "int8": 1, "uint8": 1, "bool": 1,
    "signed char": 1, "unsigned char": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
"""Element bytes by dtype as `record_param_comms` (`Float`, `BFloat16`) and `Input type`
(`float`, `c10::BFloat16`, `signed char`) spell it, lower-cased, without `c10::`."""
OP_BY_COLLECTIVE = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "_all_gather_base": "all_gather", "all_gather_into_tensor": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter", "all_to_all": "all_to_all",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_allv": "all_to_all",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast", "send": "send", "recv": "recv",
    "barrier": "barrier", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
}  # fmt: skip
"""c10d's collective names (record_param_comms' `Collective name`, `nccl:<name>`) -> our ops."""
BATCH_NAMES = frozenset({"coalesced", "batch_isend_irecv", "startcoalescing", "endcoalescing"})
"""Names of the scope around a batch: not an op of its own; the batch's ops are."""
MAX_BATCH_OPS = 256
"""A kernel carries at most this many ops recorded before its launch (more: the rest skipped)."""
MAX_TENSORS = 64
"""Tensors of an `Input Dims` read for the bytes (a longer list: the bytes stay unknown)."""
MAX_GROUP_RANKS_CHARS = 64 * 2**10
"""A `Process Group Ranks` longer than this (some 8,000 ranks) is not read: the group is then
known by its name only."""
P2P = frozenset({schema.CollectiveOp.SEND.value, schema.CollectiveOp.RECV.value})


def count(value: Any, default: int = 0) -> int:
    """A non-negative integer of the trace's args (an element count, an id) below
    MAX_ARG_INTEGER, read from an int, a whole float or a numeric string; `default` else."""
    try:
        number = int(value) if type(value) in (int, float, str) else default
    except (ValueError, OverflowError):
        return default
    return number if 0 <= number < MAX_ARG_INTEGER else default


def label(value: Any) -> str:
    """A name of the trace's args as a string of at most MAX_LABEL_CHARS ("" when absent)."""
    return str(value)[:MAX_LABEL_CHARS] if type(value) in (str, int, float) else ""


def _global_rank(value: Any) -> int | None:
    rank = count(value, default=-1)
    return rank if 0 <= rank < MAX_WORLD_SIZE else None


def _op(name: str) -> str | None:
    name = name.lower()
    return OP_BY_COLLECTIVE.get(name, name or None)


def _element_bytes(dtype: str) -> int | None:
    return DTYPE_BYTES.get(dtype.lower().removeprefix("c10::"))


def collective(params: Args) -> dict[str, Any]:
    """op, group, group_size, bytes, dtype, peer and seq of a record_param_comms event (or a
    kernel carrying its arguments), and the global ranks of its process group where the trace
    lists them (`group_ranks`, read by the loader to name the group by its axis and to build the
    layout; never kept in the tables). A rank's collectives repeat a few argument sets (one
    per bucket and layer): described once each (`_described`), but for their `seq`."""
    seq = count(params.seq, default=-1)
    fields = (
        params.collective, params.dtype, params.in_nelems, params.out_nelems,
        params.group_desc, params.group_name, params.group_size, params.group_ranks,
        params.rank_start, params.rank_stride, params.dst, params.src,
    )  # fmt: skip
    try:  # the types too: 1, 1.0 and True are one key, and read differently
        described = _described(fields, tuple(map(type, fields)))
    except TypeError:  # a list among them (unhashable): described as it is
        described = _describe(params)
    return {**described, "seq": seq if seq >= 0 else None}


_DESCRIBED_FIELDS = ("collective", "dtype", "in_nelems", "out_nelems", "group_desc",
                     "group_name", "group_size", "group_ranks", "rank_start", "rank_stride",
                     "dst", "src")  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _described(fields: tuple[Any, ...], _types: tuple[type, ...]) -> dict[str, Any]:
    """`_describe` of the arguments with these fields (only read: callers copy the dict)."""
    return _describe(Args(**dict(zip(_DESCRIBED_FIELDS, fields, strict=True))))


def _describe(params: Args) -> dict[str, Any]:
    """`collective` but `seq`."""
    op = _op(label(params.collective))
    dtype = label(params.dtype).lower()
    nelems = max(count(params.in_nelems), count(params.out_nelems))
    element_bytes = _element_bytes(dtype)
    group = label(params.group_desc)
    if not group or group == "undefined":
        name = label(params.group_name)
        group = f"pg{name}"[:MAX_LABEL_CHARS] if name else ""
    size = count(params.group_size, default=-1)
    ranks = group_ranks(params.group_ranks, params.rank_start, params.rank_stride, size)
    peer = None
    if op == schema.CollectiveOp.SEND.value:
        peer = _global_rank(params.dst)
    elif op == schema.CollectiveOp.RECV.value:
        peer = _global_rank(params.src)
    return {
        "op": op,
        "group": group or None,
        "group_size": size if size > 0 else (len(ranks) if ranks else None),
        "bytes": nelems * element_bytes if element_bytes and nelems else None,
        "dtype": dtype or None,
        "peer": peer,
        "group_ranks": ranks,
    }


def unknown(op: str | None) -> dict[str, Any]:
    """A kernel's description when the trace says nothing beyond its op."""
    return {"op": op, "group": None, "group_size": None, "bytes": None, "dtype": None,
            "peer": None, "seq": None, "group_ranks": None}  # fmt: skip


def annotated(name: str, args: Args) -> dict[str, Any]:
    """An `nccl:<op>` annotation's op and, from `Input Dims` x `Input type`, its bytes (the sum
    over its tensors; unknown when a type is unknown or the shapes are not lists of counts)."""
    described = unknown(_op(label(name)))
    dims, types = args.input_dims, args.input_type
    if type(dims) is not list or type(types) is not list or len(dims) > MAX_TENSORS:
        return described
    total, dtype = 0, ""
    for shape, kind in zip(dims, types, strict=False):
        if type(shape) is not list or not shape:
            continue  # a scalar or a tensor list: no shape to count
        element = _element_bytes(label(kind))
        if element is None or len(shape) > MAX_TENSORS:
            return described
        size = element
        for extent in shape:
            size *= count(extent, default=-1)
            if not 0 <= size < MAX_ARG_INTEGER:
                return described
        total, dtype = total + size, dtype or label(kind).lower().removeprefix("c10::")
    if total:
        described["bytes"], described["dtype"] = min(total, MAX_ARG_INTEGER - 1), dtype
    return described


def group_ranks(
    value: Any, start: Any = ABSENT, stride: Any = ABSENT, size: int = -1
) -> tuple[int, ...] | None:
    """The sorted global ranks of a process group as `record_param_comms` lists them (`"[0, 1]"`
    or a list); a list PyTorch cut short (`"[0, 8, ..., 504]"`, past 30 ranks) is rebuilt from
    `Global rank start/stride` and the group's size when the ranks shown lie on that line.
    None when absent, empty, too long or not all ranks."""
    if type(value) is list and len(value) <= MAX_GROUP_RANKS_CHARS:
        return _checked_ranks([count(item, default=-1) for item in value])
    if type(value) is not str or len(value) > MAX_GROUP_RANKS_CHARS:
        return None
    if "..." not in value:
        return _ranks_in_text(value)
    first, step = count(start, default=-1), count(stride, default=-1)
    if first < 0 or step < 1 or not 1 < size <= MAX_WORLD_SIZE:
        return None
    line = tuple(range(first, first + step * size, step))
    shown = [int(n) for n in re.findall(r"\d{1,9}", value)]
    if line[-1] >= MAX_WORLD_SIZE or not set(shown) <= set(line):
        return None
    return line


RANK_LIST = re.compile(r"\[\s*(\d+\s*(,\s*\d+\s*)*)?\]")


@functools.lru_cache(maxsize=4096)
def _ranks_in_text(text: str) -> tuple[int, ...] | None:
    """The ranks of `"[0, 8, 16]"` (every event of a group repeats the same text: parsed once)."""
    if not RANK_LIST.fullmatch(text):
        return None
    return _checked_ranks([count(item, default=-1) for item in re.findall(r"\d+", text)])


def _checked_ranks(ranks: list[int]) -> tuple[int, ...] | None:
    if not ranks or any(not 0 <= r < MAX_WORLD_SIZE for r in ranks):
        return None
    return tuple(sorted(set(ranks)))


def _names_an_op(args: Args) -> bool:
    """Whether arguments name an op of their own (not absent, not a batch's scope)."""
    return args.collective is not ABSENT and label(args.collective).lower() not in BATCH_NAMES


MAX_OPS_READ = 4096
"""Distinct `collective` values whose reading `CommAttribution` keeps (more: read each time)."""


@dataclass
class CommAttribution:
    """The CPU side of one rank's communication kernels, asked kernel by kernel (`describe`) in
    launch order; each record_param_comms scope serves one kernel at most."""

    rank: RankEvents
    used: set[tuple[Any, int]] = field(default_factory=set)
    launch_times: dict[Any, list[int]] = field(default_factory=dict)  # per thread, sorted
    counts: dict[str, int] = field(default_factory=dict)  # kernels by how they were read
    # `collective` of each shared argument set (files.SharedArgs: a rank's record_param_comms
    # repeat a few), by the set's identity; the dicts are only read (callers copy them)
    described: dict[int, tuple[Args, dict[str, Any]]] = field(default_factory=dict)
    # what each `collective` value names (whether an op of its own, and which), by its type
    # and value: a rank's kernels and scopes repeat a few
    ops_read: dict[tuple[type, Any], tuple[bool, str | None]] = field(default_factory=dict)

    def _op_read(self, args: Args) -> tuple[bool, str | None]:
        """(`_names_an_op(args)`, the op its `collective` names)."""
        value = args.collective
        key = (type(value), value)
        try:
            found = self.ops_read.get(key)
        except TypeError:  # not hashable
            return _names_an_op(args), _op(label(value))
        if found is None:
            found = (_names_an_op(args), _op(label(value)))
            if len(self.ops_read) < MAX_OPS_READ:
                self.ops_read[key] = found
        return found

    def prepare(self, kernels: Iterable[int], correlations: Any) -> None:
        """Where each thread launched communication kernels (a batch is what a thread recorded
        since its previous launch)."""
        times: dict[Any, list[int]] = {}
        for kernel in kernels:
            launch = self.rank.launches.get(int(correlations[kernel]))
            if launch is not None:
                times.setdefault(launch[0], []).append(launch[1])
        self.launch_times = {tid: sorted(found) for tid, found in times.items()}

    def describe(self, kernel: int, correlation: int) -> list[dict[str, Any]]:
        """The ops a communication kernel runs (one, or a batch's), as record fields."""
        own = self.rank.gpu_args[kernel] if kernel < len(self.rank.gpu_args) else None
        # described only where used: the op alone says whether (`collective`'s op)
        names, op = self._op_read(own) if own is not None else (False, None)
        mine = own if names else None
        if mine is not None and op not in P2P:
            return self._counted("its own arguments", [self._collective(mine)])
        launch = self.rank.launches.get(correlation)
        if launch is None:
            if mine is not None:
                return self._counted("its own arguments", [self._collective(mine)])
            return self._counted("its name (no launch found)", [self._by_name(kernel)])
        tid, at = launch
        found = self._around(tid, at)
        if found is not None and self._op_read(found)[0]:
            return self._counted("record_param_comms", [self._collective(found)])
        launched = self.launch_times.get(tid, [])
        before = bisect.bisect_left(launched, at) - 1
        since = launched[before] if before >= 0 else None
        # a batched kernel may carry one of its ops' arguments: the batch says all of them
        batch = self._batch(tid, at, since)
        if len(batch) > (mine is not None):
            return self._counted("a batch of record_param_comms", batch)
        if mine is not None:
            return self._counted("its own arguments", [self._collective(mine)])
        note = self._annotation(tid, at)
        if note is not None:
            return self._counted("its nccl:<op> annotation", [annotated(note[2], note[3])])
        notes = self._annotated_batch(tid, at, since)  # older traces: `nccl:send`, `nccl:recv`
        if notes:
            return self._counted("a batch of nccl:<op> annotations", notes)
        return self._counted("its name", [self._by_name(kernel)])

    def _collective(self, args: Args) -> dict[str, Any]:
        """`collective(args)`, once per shared argument set (a set with a correlation id is
        one event's own: described each time)."""
        if args.correlation is not ABSENT:
            return collective(args)
        found = self.described.get(id(args))
        if found is not None and found[0] is args:
            return found[1]
        described = collective(args)
        self.described[id(args)] = (args, described)
        return described

    def _counted(self, how: str, described: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.counts[how] = self.counts.get(how, 0) + 1
        return described

    def _by_name(self, kernel: int) -> dict[str, Any]:
        # `from_name`: no CPU side says what it is (not kept in the tables)
        return unknown(op_from_kernel_name(self.rank.gpu_name[kernel])) | {"from_name": True}

    def _around(self, tid: Any, at: int) -> Args | None:
        """The record_param_comms scope around a launch, once per scope."""
        rows = self.rank.params.get(tid)
        if not rows:
            return None
        i = bisect.bisect_right(self.rank.param_starts[tid], at) - 1
        if i < 0 or rows[i][1] < at or (tid, i) in self.used:
            return None
        self.used.add((tid, i))
        return rows[i][2]

    def _batch(self, tid: Any, at: int, since: int | None) -> list[dict[str, Any]]:
        """The named ops recorded on the launching thread after its previous communication
        launch and closed before this one, not served yet: a batch this launch runs."""
        rows = self.rank.params.get(tid)
        if not rows:
            return []
        starts = self.rank.param_starts[tid]
        first = 0 if since is None else bisect.bisect_right(starts, since)
        last = bisect.bisect_right(starts, at)
        out = []
        for i in range(max(first, last - MAX_BATCH_OPS), last):
            _, end, args = rows[i]
            if end > at or (tid, i) in self.used or not self._op_read(args)[0]:
                continue
            self.used.add((tid, i))
            out.append(self._collective(args))
        return out

    def _annotated_batch(self, tid: Any, at: int, since: int | None) -> list[dict[str, Any]]:
        """The `nccl:<op>` annotations that began on the launching thread after its previous
        communication launch and closed before this one: a batch's ops on older traces."""
        rows = self.rank.annotations.get(tid)
        if not rows:
            return []
        first = 0 if since is None else bisect.bisect_right(rows, since, key=lambda r: r[0])
        last = bisect.bisect_right(rows, at, key=lambda r: r[0])
        out = []
        for i in range(max(first, last - MAX_BATCH_OPS), last):
            _, end, name, args = rows[i]
            if end > at or (tid, -1 - i) in self.used or label(name).lower() in BATCH_NAMES:
                continue
            self.used.add((tid, -1 - i))  # annotations' keys: negative, apart from the scopes'
            out.append(annotated(name, args))
        return out

    def _annotation(self, tid: Any, at: int) -> tuple[int, int, str, Args] | None:
        """The innermost `nccl:<op>` annotation around the launch on its thread."""
        rows = self.rank.annotations.get(tid)
        if not rows:
            return None
        i = bisect.bisect_right(rows, at, key=lambda r: r[0]) - 1
        for j in range(i, max(i - 8, -1), -1):  # nested scopes: the innermost starts last
            if rows[j][1] >= at and label(rows[j][2]).lower() not in BATCH_NAMES:
                return rows[j]
        return None


def number_in_group(comms: list[dict[str, Any]]) -> None:
    """Each record's `seq` where the trace writes none (`Seq` is PyTorch 2.4's): its place,
    by start, among its rank's records of one process group (its ranks, else its name) and
    kind, a point-to-point message's per peer too. Members issue a group's collectives in one
    order, so the n-th of each rank is one collective (messages: the n-th on a link)."""
    if any(c.get("seq") is not None for c in comms):
        return
    seen: Counter[tuple[Any, ...]] = Counter()
    for comm in sorted(comms, key=lambda c: c["t0"]):
        group = comm.get("group_ranks") or comm.get("group")
        p2p = comm.get("op") in P2P
        key = (group, p2p, comm.get("peer") if p2p else None)
        comm["seq"] = seen[key]
        seen[key] += 1
