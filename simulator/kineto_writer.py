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
from simulator.writer import RUN_START_NS, SIMULATED_PID

TRACE_ORIGIN_NS = RUN_START_NS - 10**10
"""The clock every rank's trace counts from: 10 s before the simulated run starts."""
LAUNCH_LEAD_NS = 30_000
"""How far the CPU runs ahead of the device: each kernel is launched this long before it starts."""
CPU_OP_NS = 3_000
"""A launching operator's time on the CPU (its launch call inside it)."""
COMPUTE_STREAM = 7
NCCL_STREAMS = {"world": 20, "dp": 24, "tp": 28, "pp": 32, "ep": 36}
"""The NCCL stream of each group's communicator (one per axis, as frameworks create them)."""
_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_{}_n_tilesize128x256x64_warpgroupsize2x1x1_kernel"
_KERNELS = {
    "fwd": _GEMM.format("tn"),
    "bwd": _GEMM.format("nt"),
    "opt": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<"
    "at::native::(anonymous namespace)::TensorListMetadata<4>, "
    "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>",
}
_CPU_OPS = {"fwd": "aten::mm", "bwd": "aten::mm", "opt": "Optimizer.step#AdamW.step"}
_NCCL = "ncclDevKernel_{}(ncclDevKernelArgsStorage<4096ul>)"
_COLLECTIVE = {  # op -> (PyTorch's `Collective name`, the NCCL kernel)
    "all_reduce": ("allreduce", _NCCL.format("AllReduce_Sum_bf16_RING_LL")),
    "all_gather": ("_allgather_base", _NCCL.format("AllGather_RING_LL")),
    "reduce_scatter": ("_reduce_scatter_base", _NCCL.format("ReduceScatter_Sum_bf16_RING_LL")),
    "all_to_all": ("all_to_allv", _NCCL.format("SendRecv")),
    "broadcast": ("broadcast", _NCCL.format("Broadcast_RING_LL")),
    "send": ("send", _NCCL.format("SendRecv")),
    "recv": ("recv", _NCCL.format("SendRecv")),
}
_DTYPES = {"bfloat16": ("BFloat16", 2), "float16": ("Half", 2), "float32": ("Float", 4),
           "fp8": ("Float8_e4m3fn", 1)}  # fmt: skip


def write_kineto(run_dir: Path, out: Path) -> list[Path]:
    """The trace folder `out` of the simulated run `run_dir`: one `*.pt.trace.json` a rank."""
    manifest = schema.read_manifest(run_dir)
    groups = _process_groups(manifest.groups)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for rank in range(manifest.world_size):
        path = rank_file(run_dir, rank)
        records = rank_records(path) if path is not None else []
        trace = _trace(rank, manifest, groups, records)
        name = out / f"node{rank // _gpus_per_node(manifest)}_{_pid(rank)}.pt.trace.json"
        name.write_text(json.dumps(trace, separators=(",", ":")), encoding="utf-8")
        written.append(name)
    return written


def _pid(rank: int) -> int:
    """The rank's process id, as the simulated run's meta records give it."""
    return SIMULATED_PID + rank


def _gpus_per_node(manifest: schema.Manifest) -> int:
    return max(int(manifest.hardware.gpus_per_node or 8), 1)


def _process_groups(groups: dict[str, list[list[int]]]) -> dict[tuple[str, int], dict[str, Any]]:
    """(axis, rank) -> the process group holding the rank on that axis, as PyTorch describes
    it: a number (`pg_name`, in creation order), `pg_desc`, size and ranks."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    number = 0
    for axis in sorted(groups, key=lambda a: (a != "world", a)):  # the default group first
        for members in groups[axis]:
            desc = "default_pg" if axis == "world" else f"mesh_{axis}"
            group = {"pg_name": str(number), "pg_desc": desc, "backend_config": "cuda:nccl",
                     "pg_size": len(members), "ranks": list(members), "axis": axis}  # fmt: skip
            number += 1
            for rank in members:
                out[(axis, rank)] = group
    return out


def _trace(
    rank: int,
    manifest: schema.Manifest,
    groups: dict[tuple[str, int], dict[str, Any]],
    records: list[dict[str, Any]],
) -> dict[str, Any]:
    device = rank % _gpus_per_node(manifest)
    events = _Events(pid=_pid(rank), device=device)
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
    kernels += [(int(c["t0"]), int(c["t1"]), c) for c in comms]
    for t0, t1, what in sorted(kernels, key=lambda k: k[0]):
        if isinstance(what, str):
            kernel = _KERNELS.get(what, _KERNELS["fwd"])
            events.compute(_CPU_OPS.get(what, "aten::mm"), kernel, t0, t1)
        else:
            events.collective(what, groups.get((str(what.get("group")), rank)))
    own = {id(g): g for (_, r), g in groups.items() if r == rank}
    pg_config = [{k: v for k, v in g.items() if k != "axis"} for g in own.values()]
    return {
        "schemaVersion": 1,
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank,
            "world_size": manifest.world_size,
            "pg_count": len(pg_config),
            "pg_config": pg_config,
            "nccl_version": "2.21.5",
        },
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

    def __init__(self, pid: int, device: int) -> None:
        self.pid, self.device = pid, device
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
        start = self._launch_at(t0)
        self.events.append(self._cpu("cpu_op", cpu_op, start, start + CPU_OP_NS))
        self._launched(kernel, COMPUTE_STREAM, start + 1_000, t0, t1, {})

    def collective(self, comm: dict[str, Any], group: dict[str, Any] | None) -> None:
        op = str(comm.get("op"))
        name, kernel = _COLLECTIVE.get(op, (op, f"ncclDevKernel_{op}"))
        dtype, size = _DTYPES.get(str(comm.get("dtype")), ("BFloat16", 2))
        elements = int(comm.get("bytes") or 0) // size
        args: dict[str, Any] = {"Collective name": name, "dtype": dtype,
                                "In msg nelems": elements, "Out msg nelems": elements,
                                "In split size": "[]", "Out split size": "[]"}  # fmt: skip
        stream = NCCL_STREAMS["world"]
        if group is not None:
            args.update({
                "Group size": group["pg_size"], "Process Group Name": group["pg_name"],
                "Process Group Description": group["pg_desc"],
                "Process Group Ranks": str(group["ranks"]),
            })  # fmt: skip
            stream = NCCL_STREAMS.get(group["axis"], stream)
        t0, t1 = int(comm["t0"]), int(comm["t1"])
        start = self._launch_at(t0)
        # on its stream a kernel starts when the one before it ends (DDP's buckets, launched
        # together, run one after the other)
        t0 = min(max(t0, self._stream_free_at.get(stream, t0)), t1)
        self._stream_free_at[stream] = max(self._stream_free_at.get(stream, t1), t1)
        self.events.append(
            self._cpu("cpu_op", "record_param_comms", start, start + CPU_OP_NS, args)
        )
        self._launched(kernel, stream, start + 1_000, t0, t1, args)

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
