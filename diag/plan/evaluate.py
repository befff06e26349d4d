"""One layout evaluated: its memory, communication by dimension, step time, throughput, MFU,
and why it is rejected (None when it is feasible)."""

from __future__ import annotations

from dataclasses import dataclass

from diag.contract import ledger
from diag.plan.frameworks import GENERIC
from diag.plan.job import Cluster, Job, Layout
from diag.plan.memory import (
    PARAM_BYTES,
    MemoryPerGpu,
    block_params,
    boundary_bytes,
    expert_dp,
    layers_per_gpu,
    memory_per_gpu,
    stage_expert_params,
    stage_params,
)
from diag.plan.timing import (
    StepTime,
    model_flops_per_step,
    placement,
    recompute_flops_per_step,
    step_time,
)

GB = 1e9
PIPELINE_ENGINE_NOTE = (
    "DeepSpeed's pipeline engine refuses ZeRO-2/3 with pp > 1 (it runs ZeRO-1 there); "
    "Megatron's distributed optimizer is ZeRO-1: this layout needs FSDP-style sharding "
    "(torchtitan) to run"
)
"""Why a layout with ZeRO >= 2 and a pipeline is flagged when no framework is named: the
frameworks that run most pipelines cannot build it (deepspeed/runtime/pipe/engine.py asserts
zero_stage < 2). Under `--framework deepspeed` it is a rejection (diag.plan.frameworks)."""


@dataclass(frozen=True)
class Evaluation:
    layout: Layout
    memory: MemoryPerGpu
    time: StepTime
    comm_bytes: dict[str, float]  # payload bytes one GPU sends per step, by dimension
    tokens_per_s: float
    mfu: float  # model FLOPs over the peak of every GPU for the step
    hfu: float  # the same with the recomputed FLOPs counted (Megatron's "% of peak")
    bubble_fraction: float
    rejected: str | None  # why the layout cannot (or must not) run; None: feasible
    rejected_kind: str | None = None  # "memory", "crosses-nodes", "framework"
    notes: tuple[str, ...] = ()  # what holds the layout back without rejecting it

    @property
    def step_s(self) -> float:
        return self.time.step_s

    @property
    def feasible(self) -> bool:
        return self.rejected is None


def comm_bytes_per_step(job: Job, layout: Layout) -> dict[str, float]:
    """Payload bytes one GPU of the heaviest stage moves per step, by parallel dimension.

    `dp` is the gradient reduction, `zero` the parameter gathers, of the P parameters the GPU
    holds (2 B each, or the framework's fp32 gradients' 4 B; the experts' only where they have
    replicas, dp > ep): ZeRO-0 one all-reduce of 2P; ZeRO-1 one reduce-scatter of 2P and one
    all-gather of 2P (an all-reduce's two halves: the same wire bytes as ZeRO-0's); ZeRO-2 m
    reduce-scatters of 2P (one where the framework accumulates the full gradients: FSDP2 under
    a pipeline) and one all-gather; ZeRO-3 m reduce-scatters of 2P and, per micro-batch, each
    block's parameters gathered in forward (twice under full recomputation) and in
    backward."""
    m = job.model
    b, s, h = job.micro_batch, m.seq_len // layout.cp, m.hidden
    n, mbs = layers_per_gpu(job, layout), layout.microbatches
    forwards = 2 if layout.recompute == "full" else 1
    out = {"tp": 0.0, "cp": 0.0, "ep": 0.0, "pp": 0.0, "dp": 0.0, "zero": 0.0}
    if layout.tp > 1:
        count = ledger.tp_allreduce_count(n, mbs)
        calls = count.forward * forwards + count.backward
        out["tp"] = calls * ledger.tp_allreduce_bytes(b, s, h, PARAM_BYTES)
    if layout.cp > 1:
        out["cp"] = n * mbs * (forwards + 1) * ledger.cp_kv_bytes(b, s, m.kv_hidden, PARAM_BYTES)
    if layout.ep > 1 and m.experts:
        a2a = ledger.ep_alltoall_bytes(b * s, m.topk, h, PARAM_BYTES)
        out["ep"] = n * mbs * 2 * (forwards + 1) * a2a
    if layout.pp > 1:
        out["pp"] = 2 * layout.v * mbs * boundary_bytes(job, layout)
    params = stage_params(job, layout)
    if expert_dp(layout) == 1:  # each expert has one replica: nothing to reduce or gather
        params -= stage_expert_params(job, layout)
    if layout.dp > 1:
        reductions = job.framework.reductions(layout.zero, layout.pp, mbs)
        state = job.framework.state_at(layout.zero, layout.pp)
        out["dp"] = reductions * ledger.dp_grad_payload_bytes(params, state.reduce_bytes)
    if layout.dp > 1 and layout.zero in (1, 2):
        out["zero"] = params * PARAM_BYTES
    if layout.dp > 1 and layout.zero >= 3:
        unit = ledger.zero3_allgather_bytes(block_params(job, layout), PARAM_BYTES)
        out["zero"] = n * mbs * (forwards + 1) * unit
    return out


def framework_problem(job: Job, layout: Layout) -> str | None:
    """Why the job's framework cannot run `layout` (diag.plan.frameworks), or None."""
    lay = layout
    return job.framework.problem(lay.zero, lay.pp, lay.v, lay.cp, lay.ep, lay.recompute)


def evaluate(job: Job, layout: Layout, cluster: Cluster) -> Evaluation:
    """Every figure of `layout`, and its rejection if TP crosses nodes, the job's framework
    cannot run it, or it does not fit."""
    memory = memory_per_gpu(job, layout)
    time = step_time(job, layout, cluster)
    flops = model_flops_per_step(job)
    peak_all = time.step_s * layout.world * cluster.peak_flops_per_s
    rejected, kind = None, None
    where = placement(layout, cluster.gpus_per_node)
    budget = cluster.memory_bytes
    if where.tp:  # context parallelism may cross nodes (ring attention over IB): timed
        rejected = (
            f"TP={layout.tp} crosses nodes ({cluster.gpus_per_node} GPUs per node): pitfall 1"
        )
        kind = "crosses-nodes"
    elif (refusal := framework_problem(job, layout)) is not None:
        rejected, kind = refusal, "framework"
    elif memory.total_bytes > budget:
        rejected = f"needs {memory.total_bytes / GB:.1f} GB per GPU > {budget / GB:.0f} GB"
        kind = "memory"
    generic = job.framework is GENERIC
    notes: tuple[str, ...] = ()
    if generic and layout.zero >= 2 and layout.pp > 1:
        notes = (PIPELINE_ENGINE_NOTE,)
    if where.ep and job.model.experts:  # large MoE jobs do (EP64 over 8 nodes): priced
        notes += (
            f"EP={layout.ep} x TP={layout.tp} spans {layout.ep * layout.tp} GPUs, more than a "
            f"node's {cluster.gpus_per_node}: the experts' all-to-all crosses the inter-node "
            "links, priced in the step (keep EP inside a node where it fits; docs/physics.md)",
        )
    return Evaluation(
        layout=layout,
        memory=memory,
        time=time,
        comm_bytes=comm_bytes_per_step(job, layout),
        tokens_per_s=job.tokens_per_step / time.step_s,
        mfu=flops / peak_all,
        hfu=(flops + recompute_flops_per_step(job, layout)) / peak_all,
        bubble_fraction=ledger.bubble_fraction(layout.pp, layout.microbatches, layout.v),
        rejected=rejected,
        rejected_kind=kind,
        notes=notes,
    )
