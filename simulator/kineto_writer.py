"""A simulated run written as a GPU job's PyTorch profiler writes it (`diag simulate --format
kineto`): one Kineto trace per rank, for tests with ground truth on data shaped by another
writer's conventions, never ours.

Each rank's trace holds what a CUDA/NCCL job's profiler records, and nothing of the run
directory's labels (no phases, stages, micro-batches or tags):
- `ProfilerStep#N` on the CPU's main thread, launching every kernel of step N;
- the computation as kernels on a compute stream (GEMM and optimizer kernel names), each
  launched by a CPU operator through `cudaLaunchKernel` (matched by `correlation`); a
  blocking collective interrupts the computation around it, as the stream would;
- each collective as an NCCL kernel (`ncclDevKernel_*`) on its group's NCCL stream, launched
  inside a `record_param_comms` CPU operator whose arguments are PyTorch's: `Collective
  name`, `dtype`, `In/Out msg nelems`, `Group size`, `Process Group Name` (a number per group),
  `Process Group Description` (`mesh_<axis>`, as a DeviceMesh names its groups) and
  `Process Group Ranks`; point-to-point sends and receives are `send`/`recv` on the SendRecv
  kernel, with no tag;
- `distributedInfo` (rank, world size, `pg_config`) and the device's properties.
Times are the records' own, in Kineto's microseconds since TRACE_ORIGIN_NS (small numbers, as
a profiler's clock gives them, so that three decimals keep the nanoseconds).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diag.contract import schema
from diag.rankfile.convert import rank_file, rank_records
from simulator.kineto_shapes import (
    ANNOTATION,
    C10D,
    COLLECTIVE,
    COMPUTE_STREAM,
    CPU_OP_NS,
    CPU_OPS,
    DTYPES,
    HOST_KERNEL_SHARE,
    HOST_SLOT_NS,
    KERNELS,
    LAUNCH_LEAD_NS,
    MEGATRON,
    NCCL,
    NCCL_STREAMS,
    OLD_DTYPES,
    OLD_KERNEL,
    OLD_P2P,
    SHAPES,
    Shape,
)
from simulator.writer import RUN_START_NS, SIMULATED_PID

TRACE_ORIGIN_NS = RUN_START_NS - 10**10
"""The clock every rank's trace counts from: 10 s before the simulated run starts."""
P2P = frozenset({"send", "recv"})


def write_kineto(
    run_dir: Path, out: Path, shape: str = "devicemesh", traced: str = "all"
) -> list[Path]:
    """The trace folder `out` of the simulated run `run_dir`: one `*.pt.trace.json` per traced
    rank (`traced`: TRACED_RANKS), in the trace shape `shape` (TRACE_SHAPES)."""
    manifest = schema.read_manifest(run_dir)
    form = SHAPES[shape]
    groups = _process_groups(manifest, form)
    tp = max(int(manifest.layout.tp or 1), 1)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for rank in range(manifest.world_size):
        if traced == "one-per-tp" and rank % tp:
            continue  # the grid puts TP innermost: a TP group's first rank is a multiple of tp
        path = rank_file(run_dir, rank)
        records = rank_records(path) if path is not None else []
        trace = _trace(rank, manifest, groups, records, form)
        name = out / f"node{rank // _gpus_per_node(manifest)}_{_pid(rank)}.pt.trace.json"
        name.write_text(json.dumps(trace, separators=(",", ":")), encoding="utf-8")
        written.append(name)
    return written


def _pid(rank: int) -> int:
    """The rank's process id, as the simulated run's meta records give it."""
    return SIMULATED_PID + rank


def _gpus_per_node(manifest: schema.Manifest) -> int:
    return max(int(manifest.hardware.gpus_per_node or 8), 1)


Groups = dict[tuple[str, int], dict[str, Any]]
"""(axis or Megatron's extra group, rank) -> the process group holding the rank there."""


def _process_groups(manifest: schema.Manifest, form: Shape) -> Groups:
    """The process groups the job creates, as PyTorch describes them: a number (`pg_name`, in
    creation order), `pg_desc`, backend, size and ranks; the key `axis` (the simulator's
    group the collectives name, or None for a group that carries none here) is ours."""
    listed: list[tuple[str | None, str, str, list[int]]] = []  # (axis, desc, backend, ranks)
    world = list(range(manifest.world_size))
    listed.append(("world", "default_pg", "cuda:nccl", world))
    axes = sorted((a for a in manifest.groups if a != "world"), key=lambda a: "dptpppep".find(a))
    for axis in axes:
        for members in manifest.groups[axis]:
            named = "cp" if form.tp_as_cp_ring and axis == "tp" else axis
            desc = MEGATRON.get(axis, axis) if form.megatron_names else f"mesh_{named}"
            listed.append((axis, desc, "cuda:nccl", list(members)))
            if form.megatron_names and axis == "dp":  # Megatron's other groups of these ranks
                listed.append((None, "DATA_PARALLEL_GROUP", "cuda:nccl", list(members)))
                listed.append((None, "DATA_PARALLEL_GROUP_GLOO", "cpu:gloo", list(members)))
            if form.megatron_names and axis == "pp":
                ends = sorted({members[0], members[-1]})
                listed.append((None, "EMBEDDING_GROUP", "cuda:nccl", ends))
    if form.megatron_names:  # the model-parallel group: one data-parallel replica's ranks
        replica = manifest.world_size // max(int(manifest.layout.dp or 1), 1)
        for first in range(0, manifest.world_size, max(replica, 1)):
            listed.append((None, "MODEL_PARALLEL_GROUP", "cuda:nccl",
                           list(range(first, first + replica))))  # fmt: skip
    out: Groups = {}
    for number, (carries, desc, backend, members) in enumerate(listed):
        group = {"pg_name": str(number), "pg_desc": desc, "backend_config": backend,
                 "pg_size": len(members), "ranks": members, "axis": carries}  # fmt: skip
        for rank in members:
            out[(carries or f"{desc}#{number}", rank)] = group
    return out


def _trace(
    rank: int,
    manifest: schema.Manifest,
    groups: Groups,
    records: list[dict[str, Any]],
    form: Shape,
) -> dict[str, Any]:
    device = rank % _gpus_per_node(manifest)
    events = _Events(pid=_pid(rank), device=device, form=form, rank=rank)
    steps = [r for r in records if r.get("kind") == "step"]
    comms = [r for r in records if r.get("kind") == "comm"]
    blocking = sorted((int(c["t0"]), int(c["t1"])) for c in comms if c.get("blocking"))
    ends = [b1 for _, b1 in blocking]
    for step in steps:
        events.step(int(step["step"]), int(step["t0"]), int(step["t1"]))
    # the kernels in the order they start: the CPU launches them one after the other
    kernels: list[tuple[int, int, Any]] = []
    for span in records:
        phase = span.get("phase")
        if span.get("kind") != "span" or phase == schema.Phase.COMM_WAIT.value:
            continue
        for t0, t1 in _outside(int(span["t0"]), int(span["t1"]), blocking, ends):
            kernels.append((t0, t1, str(phase)))
    if form.tp_as_cp_ring:
        comms = _ring_rounds(comms, groups.get(("tp", rank)), rank)
    ordered = sorted(comms, key=lambda c: int(c["t0"]))
    if form.batched_p2p:
        for one in _batches(ordered):
            if isinstance(one, list):
                kernels.append((int(one[0]["t0"]), max(int(c["t1"]) for c in one), one))
            else:
                kernels.append((int(one["t0"]), int(one["t1"]), one))
    else:
        kernels += [(int(c["t0"]), int(c["t1"]), c) for c in ordered]
    for t0, t1, what in sorted(kernels, key=lambda k: k[0]):
        if isinstance(what, str):
            kernel = KERNELS.get(what, KERNELS["fwd"])
            events.compute(CPU_OPS.get(what, "aten::mm"), kernel, t0, t1)
        elif isinstance(what, list):
            events.batch(what, [groups.get((str(c.get("group")), rank)) for c in what], t1)
        else:
            events.collective(what, groups.get((str(what.get("group")), rank)))
    own = {id(g): g for (_, r), g in groups.items() if r == rank}
    info: dict[str, Any] = {"backend": "nccl", "rank": rank, "world_size": manifest.world_size}
    if form.pg_config:
        pg_config = [{k: v for k, v in g.items() if k != "axis"} for g in own.values()]
        info |= {"pg_count": len(pg_config), "pg_config": pg_config, "nccl_version": "2.21.5"}
    return {
        "schemaVersion": 1,
        "distributedInfo": info,
        "deviceProperties": [
            {
                "id": device,
                "name": "NVIDIA H100 80GB HBM3",
                "totalGlobalMem": 85_031_714_816,
                "computeMajor": 9,
                "computeMinor": 0,
                "numSms": 132,
            }
        ],
        "traceEvents": events.events,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 0,
    }


def _ring_rounds(
    comms: list[dict[str, Any]], group: dict[str, Any] | None, rank: int
) -> list[dict[str, Any]]:
    """The rank's comms with each collective of its tensor-parallel group replaced by ring
    attention's rounds (Shape.tp_as_cp_ring): in each, a send to the next member and a
    receive from the previous, both over the round's share of the collective's interval."""
    if group is None or len(group["ranks"]) < 2:
        return comms
    members = list(group["ranks"])
    size, at = len(members), members.index(rank)
    following, previous = members[(at + 1) % size], members[(at - 1) % size]
    out = []
    for comm in comms:
        if comm.get("group") != "tp" or str(comm.get("op")) in P2P:
            out.append(comm)
            continue
        t0, t1 = int(comm["t0"]), int(comm["t1"])
        rounds = size - 1
        for k in range(rounds):
            r0, r1 = t0 + (t1 - t0) * k // rounds, t0 + (t1 - t0) * (k + 1) // rounds
            for op, peer in (("send", following), ("recv", previous)):
                out.append(comm | {"op": op, "t0": r0, "t1": max(r1, r0 + 1), "peer": peer,
                                   "bytes": int(comm.get("bytes") or 0) // rounds})  # fmt: skip
    return out


def _batches(comms: list[dict[str, Any]]) -> list[Any]:
    """The rank's collectives (by start) with its sends and receives grouped as Megatron's
    `batch_isend_irecv` issues them: the point-to-point ops that start together (a send of
    what was just computed and the receive of what is needed next, both issued at once) are
    one batch, a list; other collectives stay single."""
    out: list[Any] = []
    for comm in comms:
        if str(comm.get("op")) not in P2P:
            out.append(comm)
        elif out and isinstance(out[-1], list) and int(comm["t0"]) == int(out[-1][0]["t0"]):
            out[-1].append(comm)
        else:
            out.append([comm])
    return out


FORWARD_TAGS = frozenset({"act"})
"""The simulator's tag of a message that goes forward (an activation, to the next stage);
its others (`grad`) go backward."""


def _peer(op: str, tag: Any, rank: int, ranks: list[int]) -> int | None:
    """The global rank at the other end of a simulated send or receive of a pipeline group
    (`ranks`, by stage): activations go to the next stage and come from the previous one,
    gradients the other way, around the ring (an interleaved schedule's last stage feeds the
    first's next chunk). None for other ops, or a rank outside the group."""
    if op not in P2P or rank not in ranks or len(ranks) < 2:
        return None
    forward = str(tag) in FORWARD_TAGS
    ahead = forward == (op == "send")  # a forward send, or a backward receive: the next stage
    at = ranks.index(rank)
    return ranks[(at + (1 if ahead else -1)) % len(ranks)]


def _outside(
    t0: int, t1: int, blocking: list[tuple[int, int]], ends: list[int]
) -> Iterable[tuple[int, int]]:
    """The parts of [t0, t1) outside the blocking collectives' intervals (one rank's: one after
    the other, sorted by start; `ends` their ends, the first that can reach in found by a
    binary search rather than a scan of all of them for every span)."""
    at = t0
    for b0, b1 in blocking[bisect.bisect_right(ends, t0) :]:
        if b0 >= t1:
            break
        if b0 > at:
            yield at, b0
        at = max(at, b1)
    if at < t1:
        yield at, t1


class _Events:
    """A rank's trace events, with the ids (correlation, external) a profiler gives them."""

    def __init__(
        self, pid: int, device: int, form: Shape = SHAPES["devicemesh"], rank: int = 0
    ) -> None:
        self.pid, self.device, self.form, self.rank = pid, device, form, rank
        self.events: list[dict[str, Any]] = []
        self._correlation = 1
        self._cpu_free_at = -(2**62)  # the main thread's operators never overlap
        self._stream_free_at: dict[int, int] = {}  # kernels on one stream run one at a time

    def _launch_at(self, t0: int) -> int:
        """When the CPU operator launching a kernel that starts at `t0` begins: LAUNCH_LEAD_NS
        ahead of it, or when the thread's previous operator ended."""
        start = max(t0 - LAUNCH_LEAD_NS, self._cpu_free_at)
        self._cpu_free_at = start + CPU_OP_NS
        return start

    def step(self, number: int, t0: int, t1: int) -> None:
        """`ProfilerStep#N` over the CPU's share of the step (it runs LAUNCH_LEAD_NS ahead)."""
        self.events.append(self._cpu("user_annotation", f"ProfilerStep#{number}",
                                     t0 - LAUNCH_LEAD_NS, t1 - LAUNCH_LEAD_NS))  # fmt: skip

    def compute(self, cpu_op: str, kernel: str, t0: int, t1: int) -> None:
        if self.form.host_bound:
            self._host_bound(cpu_op, kernel, t0, t1)
            return
        start = self._launch_at(t0)
        self.events.append(self._cpu("cpu_op", cpu_op, start, start + CPU_OP_NS))
        self._launched(kernel, COMPUTE_STREAM, start + 1_000, t0, t1, {})

    def _host_bound(self, cpu_op: str, kernel: str, t0: int, t1: int) -> None:
        """[t0, t1) as kernels of HOST_KERNEL_SHARE of each HOST_SLOT_NS slot, each launched by
        an operator that takes the CPU the rest of its slot: the device waits for the host."""
        at = max(t0, self._cpu_free_at)
        while at < t1:
            end = min(at + HOST_SLOT_NS, t1)
            run = max(int((end - at) * HOST_KERNEL_SHARE), 1)
            launch = max(end - run - 1_000, at)
            self.events.append(self._cpu("cpu_op", cpu_op, at, launch + 1_000))
            self._launched(kernel, COMPUTE_STREAM, launch, end - run, end, {})
            self._cpu_free_at = launch + 1_000
            at = end

    def _comm_args(self, comm: dict[str, Any], group: dict[str, Any] | None) -> dict[str, Any]:
        """`record_param_comms`'s arguments for one op, as the shape's PyTorch writes them."""
        op = str(comm.get("op"))
        name, _ = COLLECTIVE.get(op, (op, ""))
        dtype, size = DTYPES.get(str(comm.get("dtype")), ("BFloat16", 2))
        elements = int(comm.get("bytes") or 0) // size
        if not self.form.group_args:  # PyTorch of 2023: the input tensor's shape and type
            old = OLD_DTYPES.get(str(comm.get("dtype")), "c10::BFloat16")
            return {"Input Dims": [[elements], [], [], [], [], [], []],
                    "Input type": [old, "Scalar", "Scalar", "Scalar", "", "", ""]}  # fmt: skip
        args: dict[str, Any] = {"Collective name": name, "dtype": dtype,
                                "In msg nelems": elements, "Out msg nelems": elements,
                                "In split size": "[]", "Out split size": "[]"}  # fmt: skip
        if comm.get("peer") is not None and op in P2P:  # PyTorch 2.4 on: a message's peer
            args["Dst Rank" if op == "send" else "Src Rank"] = int(comm["peer"])
        if group is not None:
            args.update({
                "Group size": group["pg_size"], "Process Group Name": group["pg_name"],
                "Process Group Description": group["pg_desc"],
                "Process Group Ranks": str(group["ranks"]),
            })  # fmt: skip
            peer = _peer(op, comm.get("tag"), self.rank, group["ranks"])
            if self.form.p2p_peers and peer is not None:
                args["Rank"] = group["ranks"].index(peer)  # in the group, as c10d gives it
                args["Dst Rank" if op == "send" else "Src Rank"] = peer
        return args

    def _stream(self, group: dict[str, Any] | None) -> int:
        axis = group.get("axis") if group is not None else None
        return NCCL_STREAMS.get(str(axis), NCCL_STREAMS["world"])

    def _on_stream(self, stream: int, t0: int, t1: int) -> int:
        """On its stream a kernel starts when the one before it ends (DDP's buckets, launched
        together, run one after the other)."""
        start = min(max(t0, self._stream_free_at.get(stream, t0)), t1)
        self._stream_free_at[stream] = max(self._stream_free_at.get(stream, t1), t1)
        return start

    def collective(self, comm: dict[str, Any], group: dict[str, Any] | None) -> None:
        """One op: `c10d::<op>` (older traces), `record_param_comms` holding `nccl:<op>`,
        holding the launch of its kernel, which spins from its start (this rank's arrival)
        to the op's completion."""
        op = str(comm.get("op"))
        args = self._comm_args(comm, group)
        kernel = COLLECTIVE.get(op, (op, f"ncclDevKernel_{op}"))[1]
        if not self.form.group_args:
            kernel = OLD_P2P if op in P2P or op == "all_to_all" else OLD_KERNEL.get(op, kernel)
        stream = self._stream(group)
        t0, t1 = int(comm["t0"]), int(comm["t1"])
        start = self._launch_at(t0)
        if op in P2P:  # PyTorch gives each peer pair its own communicator and stream: a
            stream += op == "recv"  # send and a receive in flight together do not queue
        else:
            t0 = self._on_stream(stream, t0, t1)
        inner = 0
        if not self.form.group_args:  # older PyTorch: the c10d operator around it
            self.events.append(self._cpu("cpu_op", C10D.get(op, op), start, start + CPU_OP_NS,
                                         args))  # fmt: skip
            inner = 100
        self.events.append(self._cpu("cpu_op", "record_param_comms", start + inner,
                                     start + CPU_OP_NS - inner, args))  # fmt: skip
        annotation = f"nccl:{ANNOTATION.get(op, op)}"
        note_args = {k: [v[0]] for k, v in args.items() if k.startswith("Input")}
        self.events.append(self._cpu("user_annotation", annotation, start + 200,
                                     start + CPU_OP_NS - 200, note_args))  # fmt: skip
        kernel_args = args if self.form.group_args else {}
        self._launched(kernel, stream, start + 1_000, t0, t1, kernel_args)

    def batch(self, comms: list[dict[str, Any]], groups: list[Any], t1: int) -> None:
        """Sends and receives issued together (`batch_isend_irecv`): each op's
        `record_param_comms` opens and closes as it registers with NCCL (no kernel yet); then
        `ncclGroupEnd`, under `nccl:coalesced`, launches one SendRecv kernel without arguments,
        which spins until every op of the batch is done."""
        at = self._launch_at(int(comms[0]["t0"]))
        for comm, group in zip(comms, groups, strict=True):
            self.events.append(self._cpu("cpu_op", "record_param_comms", at, at + 400,
                                         self._comm_args(comm, group)))  # fmt: skip
            at += 500
        self._cpu_free_at = max(self._cpu_free_at, at + CPU_OP_NS)
        self.events.append(self._cpu("user_annotation", "nccl:coalesced", at, at + CPU_OP_NS))
        t0 = int(comms[0]["t0"])  # batches in flight together: other peers, other streams
        self._launched(NCCL.format("SendRecv"), self._stream(groups[0]), at + 1_000, t0, t1, {})

    def _launched(
        self, kernel: str, stream: int, launch: int, t0: int, t1: int, args: dict[str, Any]
    ) -> None:
        correlation = self._correlation
        self._correlation += 1
        self.events.append(self._cpu("cuda_runtime", "cudaLaunchKernel", launch, launch + 1_000,
                                     {"correlation": correlation, "cbid": 211}))  # fmt: skip
        self.events.append({
            "ph": "X", "cat": "kernel", "name": kernel, "pid": self.device, "tid": stream,
            "ts": _at(t0), "dur": _us(t1 - t0),
            "args": {"device": self.device, "stream": stream, "correlation": correlation,
                     "context": 1, **args},
        })  # fmt: skip

    def _cpu(
        self, category: str, name: str, t0: int, t1: int, args: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return {"ph": "X", "cat": category, "name": name, "pid": self.pid, "tid": self.pid,
                "ts": _at(t0), "dur": _us(t1 - t0), "args": dict(args or {})}  # fmt: skip


def _us(ns: int) -> float:
    """Kineto's microseconds, with the nanoseconds as three decimals."""
    return round(ns / 1000, 3)


def _at(ns: int) -> float:
    """A time of the run's clock as a trace's timestamp (us since TRACE_ORIGIN_NS)."""
    return _us(ns - TRACE_ORIGIN_NS)
