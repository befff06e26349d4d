"""The names and forms of a GPU job's profiler trace that `diag simulate --format kineto`
writes (simulator/kineto_writer.py): kernel, operator and group names as PyTorch, NCCL and the
frameworks spell them, and the trace shapes (`Shape`), each from a real trace's form."""

from __future__ import annotations

from dataclasses import dataclass

LAUNCH_LEAD_NS = 30_000
"""How far the CPU runs ahead of the device: each kernel is launched this long before it starts."""
CPU_OP_NS = 3_000
"""A launching operator's time on the CPU (its launch call inside it)."""
COMPUTE_STREAM = 7
NCCL_STREAMS = {"world": 20, "dp": 24, "tp": 28, "pp": 32, "ep": 36}
"""The NCCL stream of each group's communicator (one per axis, as frameworks create them)."""
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_{}_n_tilesize128x256x64_warpgroupsize2x1x1_kernel"
KERNELS = {
    "fwd": GEMM.format("tn"),
    "bwd": GEMM.format("nt"),
    "opt": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<"
    "at::native::(anonymous namespace)::TensorListMetadata<4>, "
    "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>",
}
CPU_OPS = {"fwd": "aten::mm", "bwd": "aten::mm", "opt": "Optimizer.step#AdamW.step"}
NCCL = "ncclDevKernel_{}(ncclDevKernelArgsStorage<4096ul>)"
COLLECTIVE = {  # op -> (PyTorch's `Collective name`, the NCCL kernel)
    "all_reduce": ("allreduce", NCCL.format("AllReduce_Sum_bf16_RING_LL")),
    "all_gather": ("_allgather_base", NCCL.format("AllGather_RING_LL")),
    "reduce_scatter": ("_reduce_scatter_base", NCCL.format("ReduceScatter_Sum_bf16_RING_LL")),
    "all_to_all": ("all_to_allv", NCCL.format("SendRecv")),
    "broadcast": ("broadcast", NCCL.format("Broadcast_RING_LL")),
    "send": ("send", NCCL.format("SendRecv")),
    "recv": ("recv", NCCL.format("SendRecv")),
}
DTYPES = {"bfloat16": ("BFloat16", 2), "float16": ("Half", 2), "float32": ("Float", 4),
           "fp8": ("Float8_e4m3fn", 1)}  # fmt: skip


TRACE_SHAPES = ("devicemesh", "megatron", "old", "host-bound", "ring-cp")
"""The shapes `diag simulate --format kineto --trace-shape` writes (docs/simulator.md)."""
TRACED_RANKS = ("all", "one-per-tp")
"""Which ranks' traces are written: every rank's, or one per tensor-parallel group (its first)."""
HOST_SLOT_NS = 40_000
"""host-bound: the computation is kernels of at most this long a slot each, ..."""
HOST_KERNEL_SHARE = 0.3
"""... of which the kernel runs this share at the slot's end: the CPU spends the rest of the
slot on the operator that launches it, so the device idles waiting for the launch."""


@dataclass(frozen=True)
class Shape:
    """What a trace shape writes (each from a real trace's form: see the module's text)."""

    megatron_names: bool = False
    """Megatron-LM's group descriptions (`TENSOR_MODEL_PARALLEL_GROUP`, ...) and its extra
    groups in `pg_config`; else DeviceMesh's (`mesh_tp`, ...)."""
    group_args: bool = True
    """`record_param_comms` with `Collective name`, `In/Out msg nelems`, `Process Group *`
    (PyTorch >= 2.2); False: only `Input Dims` and `Input type` (the PyTorch of 2023)."""
    pg_config: bool = True
    """`distributedInfo.pg_config` (False: backend, rank and world size only)."""
    batched_p2p: bool = False
    """Sends and receives issued together through `batch_isend_irecv`: one SendRecv kernel
    per batch, launched at `ncclGroupEnd` under `nccl:coalesced`, after each op's
    `record_param_comms` scope has closed: the kernel carries no arguments."""
    host_bound: bool = False
    """The computation as many short kernels each launched just before it runs (HOST_SLOT_NS)."""
    tp_as_cp_ring: bool = False
    """The job's tensor-parallel groups as context-parallel ones (`mesh_cp`) running ring
    attention: each of its collectives becomes size - 1 rounds in which every member sends
    its block of keys and values to the next member and receives the previous one's (the
    last sending to the first), each with its peer (`Dst Rank` / `Src Rank`, PyTorch 2.4 on),
    over the collective's interval. The layout's truth: cp = the simulated tp, tp = 1."""
    p2p_peers: bool = False
    """A send's or receive's `record_param_comms` names its peer: `Rank` (in its group) and
    `Dst Rank` / `Src Rank` (global), as PyTorch >= 2.5 writes them (profiler/util.cpp's
    saveNcclMeta); without, only the group says who the peer may be (PyTorch 2.4 and
    older)."""


SHAPES = {
    "devicemesh": Shape(),
    "megatron": Shape(megatron_names=True, batched_p2p=True, p2p_peers=True),
    "old": Shape(group_args=False, pg_config=False),
    "host-bound": Shape(host_bound=True),
    "ring-cp": Shape(tp_as_cp_ring=True),
}
MEGATRON = {"world": "default_pg", "dp": "DATA_PARALLEL_GROUP_WITH_CP",
             "tp": "TENSOR_MODEL_PARALLEL_GROUP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
             "ep": "EXPERT_MODEL_PARALLEL_GROUP"}  # fmt: skip
"""The Megatron-LM group (megatron/core/parallel_state.py) each axis's collectives run on:
its DDP reduces gradients over the data-parallel group with context parallelism (the same
ranks at cp = 1)."""
OLD_NCCL = "ncclKernel_{}(ncclDevComm*, unsigned long, ncclWork*)"
OLD_KERNEL = {  # op -> the NCCL 2.1x kernel (hta-sampled-world128, hta-nccl-world2)
    "all_reduce": OLD_NCCL.format("AllReduce_RING_LL_Sum_bfloat16"),
    "all_gather": OLD_NCCL.format("AllGather_RING_LL_Sum_int8_t"),
    "reduce_scatter": OLD_NCCL.format("ReduceScatter_RING_LL_Sum_bfloat16"),
    "broadcast": OLD_NCCL.format("Broadcast_RING_LL_Sum_int8_t"),
}
OLD_P2P = OLD_NCCL.format("SendRecv_RING_SIMPLE_Sum_int8_t")
ANNOTATION = {"all_reduce": "all_reduce", "all_gather": "_all_gather_base",
               "reduce_scatter": "_reduce_scatter_base", "all_to_all": "all_to_all",
               "broadcast": "broadcast", "send": "send", "recv": "recv"}  # fmt: skip
"""The `nccl:<name>` annotation ProcessGroupNCCL opens around each op's launch."""
C10D = {"all_reduce": "c10d::allreduce_", "all_gather": "c10d::_allgather_base_",
         "reduce_scatter": "c10d::_reduce_scatter_base_", "all_to_all": "c10d::alltoall_base_",
         "broadcast": "c10d::broadcast_", "send": "c10d::send", "recv": "c10d::recv_"}  # fmt: skip
OLD_DTYPES = {"bfloat16": "c10::BFloat16", "float16": "c10::Half", "float32": "float",
               "fp8": "c10::Float8_e4m3fn"}  # fmt: skip
