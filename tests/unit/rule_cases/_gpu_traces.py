"""Kineto trace folders of data-parallel GPU jobs, written in the shape real traces have
(../shared/real-traces/hta-nccl-world2: `cpu_op`s on the training thread with their
`cudaLaunchKernel` inside, kernels on stream 7 in the device's pid, NCCL on its own stream
launched inside `record_param_comms` / `nccl:all_reduce`, `.item()` as `aten::item` ->
`aten::_local_scalar_dense` -> `cudaMemcpyAsync` + `cudaStreamSynchronize`, fractional
microsecond timestamps, `distributedInfo` with its `pg_config`).

Every step: the data loader's `__next__`, `ops` operators each launching one kernel, a loss
read with `.item()` halfway, the gradients' all-reduce, and the loss read again at the end,
which waits for the all-reduce. The ranks run in lockstep: an all-reduce kernel runs from its
launch until the last rank has launched it, plus the transfer.

- host-bound (`cpu_us` per operator larger than `kernel_us`): the CPU issues each small kernel
  slower than the GPU runs it; the GPU idles between kernels waiting for the next launch
  (HTA: host wait), more on the ranks with a slower host;
- GPU-bound (`cpu_us` much smaller than `kernel_us`): the CPU runs ahead and the kernels queue
  back to back; only the sync at each step's end lets the GPU run dry briefly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_US = 4_458_676_416_788.066  # a real trace's clock (hta-nccl-world2)
PID, DEVICE, COMPUTE_STREAM, NCCL_STREAM = 2910249, 0, 7, 20
MAIN_TID = 2910249
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


@dataclass(frozen=True)
class Shape:
    """One job: per rank, the CPU time per operator; the kernels' name and duration."""

    cpu_us: Sequence[float]  # per rank: each operator's CPU time (its launch inside)
    kernel_us: float
    kernel_name: str
    ops: int = 120
    steps: int = 4
    launch_us: float = 5.0
    loader_us: float = 40.0
    allreduce_us: float = 150.0  # the transfer, once the last rank has launched it
    queued_wait_us: float = 0.0  # a kernel each step waits this long on an unrecorded event


def host_bound(world: int = 8) -> Shape:
    """Small element-wise kernels (8 us) issued by a CPU that takes 20-48 us an operator,
    slower on higher ranks: the GPUs idle 34-76% of the time, nearly all of it host wait."""
    return Shape(cpu_us=[20.0 + 28.0 * r / max(world - 1, 1) for r in range(world)],
                 kernel_us=8.0, kernel_name=ELEMENTWISE)  # fmt: skip


def gpu_bound(world: int = 8, queued_wait_us: float = 0.0) -> Shape:
    """400 us GEMMs issued in 6 us each: the GPU always has work queued (`queued_wait_us`:
    one each step waits that long on a dependency no trace event records)."""
    return Shape(cpu_us=[6.0] * world, kernel_us=400.0, kernel_name=GEMM, ops=40,
                 queued_wait_us=queued_wait_us)  # fmt: skip


@dataclass
class _Rank:
    rank: int
    events: list[dict[str, Any]] = field(default_factory=list)
    t: float = BASE_US  # the training thread's clock
    gpu_free: float = BASE_US  # when the compute stream runs dry
    nccl_free: float = BASE_US
    correlation: int = 1000

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": MAIN_TID,
                            "ts": round(ts, 3), "dur": round(dur, 3), "args": args})  # fmt: skip

    def launch(self, at: float, name: str, cat: str = "kernel", stream: int = COMPUTE_STREAM,
               start: float | None = None, dur: float = 0.0, runtime: str = "cudaLaunchKernel",
               launch_us: float = 5.0) -> float:  # fmt: skip
        """The runtime call at `at` and its device event; returns the device event's end."""
        self.correlation += 1
        c = self.correlation
        self.cpu(runtime, at, launch_us, cat="cuda_runtime", correlation=c)
        begin = start if start is not None else max(at + launch_us + 2.0, self.gpu_free)
        args = {"device": DEVICE, "stream": stream, "correlation": c}
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": DEVICE, "tid": stream,
                            "ts": round(begin, 3), "dur": round(dur, 3), "args": args})  # fmt: skip
        return begin + dur

    def item(self, waits_for: float = 0.0) -> None:
        """`.item()`: copy one value to the host after the compute stream (and `waits_for`)
        drains, and wait for it."""
        start = self.t
        copy_at = start + 8.0
        copy_start = max(copy_at + 7.0, self.gpu_free, waits_for)
        end = self.launch(copy_at, "Memcpy DtoH (Device -> Pinned)", cat="gpu_memcpy",
                          start=copy_start, dur=2.0, runtime="cudaMemcpyAsync")  # fmt: skip
        self.gpu_free = end
        self.cpu("cudaStreamSynchronize", copy_at + 6.0, end + 2.0 - (copy_at + 6.0),
                 cat="cuda_runtime", correlation=0)  # fmt: skip
        self.cpu("aten::_local_scalar_dense", start + 2.0, end + 3.0 - (start + 2.0))
        self.cpu("aten::item", start, end + 4.0 - start)
        self.t = end + 6.0


def write_job(folder: Path, shape: Shape) -> Path:
    """The job's trace folder (one `rank<N>.json` per rank), written into `folder`."""
    world = len(shape.cpu_us)
    ranks = [_Rank(r) for r in range(world)]
    for step in range(shape.steps):
        starts = [r.t for r in ranks]
        launches = []
        for r in ranks:
            cpu = shape.cpu_us[r.rank]
            r.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", r.t,
                  shape.loader_us, cat="user_annotation")  # fmt: skip
            r.t += shape.loader_us + 2.0
            for op in range(shape.ops):
                if op == shape.ops // 2:
                    r.item()
                r.cpu("aten::add", r.t, cpu)
                at = r.t + cpu - shape.launch_us - 1.0
                # a kernel a quarter into the step (the CPU well ahead) may wait on an event no
                # trace event records: queued since its launch, it starts that long after its
                # stream ran dry
                held = (
                    shape.queued_wait_us if op == shape.ops // 4 and shape.queued_wait_us else None
                )
                start = None if held is None else max(at + shape.launch_us, r.gpu_free) + held
                r.gpu_free = r.launch(at, shape.kernel_name, dur=shape.kernel_us, start=start,
                                      launch_us=shape.launch_us)  # fmt: skip
                r.t += cpu + 1.0
            launches.append(r.t + 20.0)  # the all-reduce's launch inside record_param_comms
        transfer_end = max(launches) + 7.0 + shape.allreduce_us
        for r, at in zip(ranks, launches, strict=True):
            r.cpu("record_param_comms", r.t, 40.0, **{
                "Collective name": "allreduce", "In msg nelems": 1_000_000,
                "Out msg nelems": 1_000_000, "dtype": "Float", "Process Group Name": "0",
                "Process Group Description": "default_pg", "Group size": world,
                "Process Group Ranks": json.dumps(list(range(world)))})  # fmt: skip
            r.cpu("nccl:all_reduce", r.t + 5.0, 30.0, cat="user_annotation")
            start = max(at + 7.0, r.gpu_free)
            r.nccl_free = r.launch(at, ALL_REDUCE, stream=NCCL_STREAM, start=start,
                                   dur=max(transfer_end - start, shape.allreduce_us))  # fmt: skip
            r.t += 45.0
            r.item(waits_for=r.nccl_free)  # the loss, after the gradients are reduced
        ends = [r.t for r in ranks]
        for r, s0 in zip(ranks, starts, strict=True):
            r.cpu(f"ProfilerStep#{step + 1}", s0, max(ends) - s0, cat="user_annotation")
        for r in ranks:  # the next step starts together (the loss read waited for everyone)
            r.t = max(ends) + 30.0
    folder.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        group = {"pg_name": "0", "pg_desc": "default_pg", "pg_size": world,
                 "backend_config": "cuda:nccl", "ranks": list(range(world))}  # fmt: skip
        info = {"backend": "nccl", "rank": r.rank, "world_size": world, "pg_config": [group]}
        trace = {"schemaVersion": 1, "distributedInfo": info,
                 "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                 "traceEvents": sorted(r.events, key=lambda e: e["ts"]),
                 "displayTimeUnit": "ms"}  # fmt: skip
        (folder / f"rank{r.rank}.json").write_text(json.dumps(trace))
    return folder
