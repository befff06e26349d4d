"""Memory per GPU in the six categories (docs/metrics.md) for one layout, from the ledger.

Static state is what the job's framework keeps per parameter (diag.plan.frameworks: by
default the ZeRO paper's 16 B/param, SEED §1) of the parameters the GPU's stage holds after
tensor, pipeline and expert splits, each part whole or sharded by the ZeRO stage. ZeRO shards
over the group that holds the same parameters: the dense part over dp, the experts over the
expert-data-parallel group dp / ep (each expert has dp / ep replicas; Megatron-Core's and
DeepSpeed-MoE's expert DP group). The fp32 gradient buffers a framework keeps are counted in
grads (and named apart: `MemoryPerGpu.fp32_grads`). ZeRO-2 keeps the 1/dp partition of the
gradients plus the full-size gradients of one reduce bucket (DeepSpeed reduce-scatters them
after each micro-batch's backward: a partition cannot accumulate the next micro-batch's full
gradients). Activations are the block's (diag.plan.activations: Korthikanti 2022's count for
the block the job trains) times the blocks the stage holds in flight at its peak
(diag.plan.pipeline: 1F1B about p micro-batches of its chunk, independent of m; interleaved a
little more), plus the fp32 logits on the last stage. Buffers as the simulator counts them;
fragmentation a share of the rest, plus the framework's runtime reserve (named apart:
`MemoryPerGpu.reserve`). Each stage that can be the heaviest (the first, the second, the last)
is counted; the one that needs the most is the layout's.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.contract import ledger
from diag.plan.activations import block_activation_bytes
from diag.plan.frameworks import PerParam
from diag.plan.job import Job, Layout
from diag.plan.pipeline import Stage, blocks_in_flight, stages
from simulator.config import layer_params

PARAM_BYTES = 2  # bf16 parameters (and gradients, activations, messages)
GRAD_BYTES = 2
FRAGMENTATION_SHARE = 0.05
"""Allocator fragmentation as a share of the allocated bytes (the simulator's default)."""


@dataclass(frozen=True)
class MemoryPerGpu:
    """Bytes on the most loaded GPU of a layout, by category."""

    params: float
    grads: float
    optimizer: float
    activations: float
    comm_buffers: float
    fragmentation: float
    fp32_grads: float = 0.0  # of grads: the framework's fp32 gradient buffers
    reserve: float = 0.0  # of fragmentation: the runtime's memory outside the allocator

    @property
    def static_bytes(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total_bytes(self) -> float:
        return self.static_bytes + self.activations + self.comm_buffers + self.fragmentation

    def as_dict(self) -> dict[str, float]:
        """The six categories and their total (the parts named apart are in `parts`)."""
        return {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "comm_buffers": self.comm_buffers,
            "fragmentation": self.fragmentation,
            "total": self.total_bytes,
        }

    def parts(self) -> dict[str, float]:
        """What the categories hold that the framework adds: fp32 gradient buffers (in
        grads), the runtime reserve (in fragmentation)."""
        return {"fp32_grads": self.fp32_grads, "reserve": self.reserve}


def block_params(job: Job, layout: Layout) -> float:
    """One block's parameters on one GPU (its TP shard, its experts)."""
    return layer_params(job.model, layout.tp, layout.ep).total * job.param_scale


def block_expert_params(job: Job, layout: Layout) -> float:
    """The experts of one block on one GPU (its EP share, each expert TP-split); 0 if dense."""
    return layer_params(job.model, layout.tp, layout.ep).experts * job.param_scale


def expert_dp(layout: Layout) -> int:
    """Replicas of each expert: the expert-data-parallel group ZeRO shards expert state over."""
    return max(layout.dp // layout.ep, 1)


def held(dense: float, experts: float, layout: Layout, per_param: PerParam) -> float:
    """Bytes of `per_param` for `dense` + `experts` parameters of one GPU: its whole part of
    each, its sharded part of the dense over dp and of the experts over dp / ep."""
    whole = per_param.whole * (dense + experts)
    return whole + per_param.sharded * (dense / layout.dp + experts / expert_dp(layout))


def zero_sharded(dense: float, experts: float, layout: Layout, from_stage: int) -> float:
    """`dense` + `experts` of one GPU after ZeRO when its stage is at least `from_stage`: the
    dense part over dp, the experts over dp / ep (unsharded below `from_stage`)."""
    if layout.zero < from_stage:
        return dense + experts
    return dense / layout.dp + experts / expert_dp(layout)


def pipeline_stages(job: Job, layout: Layout) -> tuple[Stage, ...]:
    """The stages of `layout` that can be its heaviest (diag.plan.pipeline)."""
    return stages(job.model.layers, layout.pp, layout.v)


def layers_per_gpu(job: Job, layout: Layout) -> int:
    """Blocks on the pipeline GPU that holds the most."""
    return max(stage.blocks for stage in pipeline_stages(job, layout))


def params_of(job: Job, layout: Layout, stage: Stage) -> float:
    """Parameters on one GPU of `stage`: its blocks plus the embedding or the head."""
    m, tp = job.model, layout.tp
    ends = 0.0
    if stage.embedding:
        ends += m.vocab * m.hidden / tp + (m.seq_len * m.hidden if m.learned_positions else 0)
    if stage.head:
        ends += m.vocab * m.hidden / tp if (layout.pp > 1 or not m.tied_embeddings) else 0.0
        ends += 2 * m.hidden  # final LayerNorm
    return stage.blocks * block_params(job, layout) + ends * job.param_scale


def expert_params_of(job: Job, layout: Layout, stage: Stage) -> float:
    """The expert part of `params_of` (the ends are dense)."""
    return stage.blocks * block_expert_params(job, layout)


def stage_params(job: Job, layout: Layout) -> float:
    """Parameters on the pipeline GPU that holds the most."""
    return max(params_of(job, layout, stage) for stage in pipeline_stages(job, layout))


def stage_expert_params(job: Job, layout: Layout) -> float:
    """Expert parameters on the pipeline GPU that holds the most parameters."""
    heaviest = max(pipeline_stages(job, layout), key=lambda stage: params_of(job, layout, stage))
    return expert_params_of(job, layout, heaviest)


def layer_activation_bytes(job: Job, layout: Layout, recompute: str | None = None) -> float:
    """One block's activations for one micro-batch on one GPU (diag.plan.activations), kept
    under `recompute` (default: the layout's)."""
    m = job.model
    return block_activation_bytes(
        m,
        job.training,
        max(m.seq_len // layout.cp, 1),
        job.micro_batch,
        layout.tp,
        layout.sequence_parallel and layout.tp > 1,
        layout.recompute if recompute is None else recompute,
    )


def activation_bytes(job: Job, layout: Layout, stage: Stage) -> float:
    """Activations on one GPU of `stage` at its peak, plus the fp32 logits on the last and,
    under full recomputation, the working set of the block being recomputed: its backward
    rebuilds that block's whole activations (one micro-batch) on top of the inputs kept."""
    m = job.model
    held = blocks_in_flight(stage, layout.pp, layout.microbatches)
    logits = job.micro_batch * m.seq_len / layout.cp * m.vocab / layout.tp * 4 if stage.head else 0
    working = layer_activation_bytes(job, layout, "none") if layout.recompute == "full" else 0.0
    return layer_activation_bytes(job, layout) * held + logits + working


def boundary_bytes(job: Job, layout: Layout) -> float:
    """One pipeline message on one GPU: the hidden state b s h, sharded s / t by sequence
    parallelism (Korthikanti 2022; Megatron's scatter/gather did the same before it,
    Narayanan 2021 section 4.1: each TP rank sends its share over its own link)."""
    m = job.model
    whole = ledger.pp_boundary_bytes(job.micro_batch, m.seq_len // layout.cp, m.hidden, 2)
    return whole / (layout.tp if layout.sequence_parallel and layout.tp > 1 else 1)


def comm_buffer_bytes(job: Job, layout: Layout, params: float) -> float:
    """DDP's flat gradient buffer (or the fp32 bucket the framework's reduction copies),
    pipeline send/receive buffers, ZeRO-3's gathered units and one unit's full gradients
    before their reduce-scatter, the all-to-all buffers of expert parallelism (at the
    capacity factor)."""
    m = job.model
    state = job.framework.state_at(layout.zero, layout.pp)
    buffers = 0.0
    if layout.dp > 1:
        buffers += params * state.flat_buffer
        fp32 = params * (state.fp32_grads.whole + state.fp32_grads.sharded / layout.dp)
        buffers += min(fp32, state.reduce_bucket_bytes)
    boundary = boundary_bytes(job, layout)
    if layout.pp > 1:
        buffers += 2 * boundary
    if layout.zero >= 3 and layout.dp > 1:  # this unit, the prefetched next, the unit's grads
        buffers += 3 * ledger.zero3_allgather_bytes(block_params(job, layout), PARAM_BYTES)
    if layout.ep > 1:
        tokens = job.micro_batch * m.seq_len // layout.cp
        a2a = ledger.ep_alltoall_bytes(tokens, m.topk, m.hidden, PARAM_BYTES)
        buffers += 4 * a2a * m.capacity_factor
    return buffers


def memory_per_gpu(job: Job, layout: Layout) -> MemoryPerGpu:
    """The six categories on the GPU of `layout` that needs the most memory."""
    return max(
        (stage_memory(job, layout, stage) for stage in pipeline_stages(job, layout)),
        key=lambda memory: memory.total_bytes,
    )


def stage_memory(job: Job, layout: Layout, stage: Stage) -> MemoryPerGpu:
    """The six categories on one GPU of `stage`."""
    params = params_of(job, layout, stage)
    experts = expert_params_of(job, layout, stage)
    dense = params - experts
    framework = job.framework
    state = framework.state_at(layout.zero, layout.pp)
    weights = held(dense, experts, layout, state.params)
    fp32_grads = held(dense, experts, layout, state.fp32_grads)
    grads = held(dense, experts, layout, state.grads) + fp32_grads
    if state.grad_bucket_bytes and layout.dp > 1:  # the bucket being filled, reduce-scattered
        grads += min(params * GRAD_BYTES, state.grad_bucket_bytes)
    optimizer = held(dense, experts, layout, state.optimizer)
    activations = activation_bytes(job, layout, stage)
    buffers = comm_buffer_bytes(job, layout, params)
    allocated = weights + grads + optimizer + activations + buffers
    reserve = framework.reserve_bytes
    fragmentation = allocated * FRAGMENTATION_SHARE + reserve
    return MemoryPerGpu(
        weights, grads, optimizer, activations, buffers, fragmentation, fp32_grads, reserve
    )
