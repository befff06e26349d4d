"""Predicted step time of one layout, in the simulator's cost model, and the FLOPs behind MFU.

The pieces are `simulator.costs.Costs`'s: compute from FLOPs over the device's achieved rate,
each collective `latency + payload x bus_factor / (link GB/s x NCCL efficiency)` on the
intra- or inter-node link its group sits on, the optimizer over HBM bandwidth. They are
composed as `simulator.engine` runs them, in closed form for the heaviest stage (the engine
replays every rank; tests/unit/test_plan_engine.py holds the two together):
- a micro-batch is its layers' forward and backward (twice the forward; flash attention's
  backward also recomputes Q K^T), with the TP all-reduces on the critical path (2 per layer
  forward, 2 backward), context parallelism's key/value gathers, expert parallelism's 4
  all-to-alls per layer, ZeRO-3's parameter gathers where the layer's compute does not hide
  them, and the recomputed forward;
- a pipeline runs m micro-batch slots of its heaviest stage and (p-1)/v of its mean stage
  (the bubble; the stages as diag.plan.pipeline splits them) and pays one activation and one
  gradient transfer for each of its v m chunk passes and the p - 1 of the fill;
- the data-parallel reduction of the gradients in buckets (at most 4, ready evenly over a
  backward, as the engine does; what outlasts the backward is exposed), by ZeRO stage:
  0 (DDP) one all-reduce in the last backward; 1 one reduce-scatter in the last backward (the
  gradients accumulate in full); 2 one reduce-scatter in every micro-batch's backward
  (DeepSpeed: a 1/dp partition cannot accumulate full gradients), m per step; 3 the
  per-micro-batch gathers and reduce-scatters of each unit (below). The dense gradients
  reduce over dp, the experts' over their dp / ep replicas;
- then the optimizer, then ZeRO-1/2's all-gather of the updated parameters (after the step,
  as DeepSpeed runs it; Megatron's --overlap-param-gather would hide it under the next
  forward, not modelled), then a fixed host overhead per step (0 unless calibrated);
- a calibrated cluster also pays a fixed cost per forward or backward pass of a micro-batch
  through a chunk (`Cluster.pass_overhead_s`): interleaving makes v times the passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from diag.contract import ledger
from diag.plan.job import Cluster, Job, Layout
from diag.plan.memory import (
    PARAM_BYTES,
    block_params,
    boundary_bytes,
    expert_dp,
    pipeline_stages,
    stage_expert_params,
    stage_params,
    zero_sharded,
)
from diag.plan.pipeline import Stage
from simulator.costs import Costs, attention_flops, head_flops, mlp_flops, router_flops
from simulator.engine import MAX_BUCKETS

NS = 1e-9  # seconds per ns
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket


def crosses_nodes(stride: int, size: int, gpus_per_node: int) -> bool:
    """Whether groups of `size` ranks `stride` apart (rank grid, tp innermost) span hosts."""
    if size <= 1:
        return False
    extent = stride * size
    return not (extent <= gpus_per_node and gpus_per_node % extent == 0)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step on the pipeline's heaviest GPU, by what they are spent on."""

    compute_s: float  # forward, backward and recomputation of the step's micro-batches
    tp_s: float
    cp_s: float
    ep_s: float
    zero_s: float  # ZeRO parameter gathers: ZeRO-3's not hidden under compute, ZeRO-1/2's after
    # the optimizer
    pp_bubble_s: float
    pp_p2p_s: float
    dp_s: float  # gradient reduction (all-reduce or reduce-scatters) not hidden under backward
    optimizer_s: float
    overhead_s: float

    @property
    def step_s(self) -> float:
        return sum(self.as_dict().values())

    def as_dict(self) -> dict[str, float]:
        return {
            "compute_s": self.compute_s,
            "tp_s": self.tp_s,
            "cp_s": self.cp_s,
            "ep_s": self.ep_s,
            "zero_s": self.zero_s,
            "pp_bubble_s": self.pp_bubble_s,
            "pp_p2p_s": self.pp_p2p_s,
            "dp_s": self.dp_s,
            "optimizer_s": self.optimizer_s,
            "overhead_s": self.overhead_s,
        }


@dataclass(frozen=True)
class Placement:
    """Which of a layout's groups span nodes."""

    tp: bool
    cp: bool
    ep: bool
    pp: bool
    dp: bool


def placement(layout: Layout, gpus_per_node: int) -> Placement:
    """Grid order, innermost first: tp, cp, ep (inside dp), pp, the rest of dp."""
    tp, cp, ep = layout.tp, layout.cp, layout.ep
    return Placement(
        tp=crosses_nodes(1, tp, gpus_per_node),
        cp=crosses_nodes(tp, cp, gpus_per_node),
        ep=crosses_nodes(tp * cp, ep, gpus_per_node),
        pp=crosses_nodes(tp * cp * ep, layout.pp, gpus_per_node),
        dp=crosses_nodes(tp * cp * layout.pp, layout.dp, gpus_per_node),
    )


def layer_forward_flops(job: Job) -> float:
    """Forward FLOPs of one block over one micro-batch (the whole block, before any split)."""
    m = replace(job.model, micro_batch=job.micro_batch)
    flops = attention_flops(m)
    if m.experts:
        return flops + router_flops(m) + mlp_flops(m, m.tokens * m.topk)
    return flops + mlp_flops(m, m.tokens)


def model_flops_per_step(job: Job) -> float:
    """Model FLOPs of one step: 3 x forward (backward is twice the forward), no recompute."""
    m = replace(job.model, micro_batch=job.micro_batch)
    per_mb = m.layers * layer_forward_flops(job) + head_flops(m)
    return 3 * per_mb * job.global_batch / job.micro_batch


def scores_flops(job: Job) -> float:
    """Forward FLOPs of one block's attention scores (Q K^T and the values), one micro-batch."""
    return 4.0 * job.micro_batch * job.model.seq_len**2 * job.model.hidden


def recompute_flops_per_step(job: Job, layout: Layout) -> float:
    """The extra FLOPs recomputation adds: a whole forward (full), the scores (selective),
    and flash attention's Q K^T again in every backward (half the scores)."""
    m = job.model
    mbs = job.global_batch / job.micro_batch
    flash = scores_flops(job) / 2 if job.training.flash_attention else 0.0
    if layout.recompute == "full":
        return m.layers * (layer_forward_flops(job) + flash) * mbs
    if layout.recompute == "selective" and not job.training.flash_attention:
        return m.layers * scores_flops(job) * mbs
    return m.layers * flash * mbs


def step_time(job: Job, layout: Layout, cluster: Cluster) -> StepTime:
    """The predicted step of `layout` for `job` on `cluster`."""
    hw = cluster.hardware
    model = replace(job.model, micro_batch=job.micro_batch)
    where = placement(layout, cluster.gpus_per_node)
    # compute divides over tp and cp alike: the simulator's Costs split by their product
    costs = Costs(model, hw, layout.tp * layout.cp)
    rate_per_ns = hw.flops_per_s * NS
    layer_fwd_ns = layer_forward_flops(job) / (layout.tp * layout.cp) / rate_per_ns
    if model.experts:  # each EP rank computes the tokens routed to its experts
        layer_fwd_ns = costs.attn_fwd_ns + costs.router_fwd_ns
        layer_fwd_ns += costs.expert_row_fwd_ns * model.tokens * model.topk
    scores_ns = scores_flops(job) / (layout.tp * layout.cp * rate_per_ns)
    flash_ns = scores_ns / 2 if job.training.flash_attention else 0.0  # Q K^T in backward
    selective_ns = 0.0 if job.training.flash_attention else scores_ns
    recompute_ns = {"none": 0.0, "selective": selective_ns, "full": layer_fwd_ns + flash_ns}
    forwards = 2 if layout.recompute == "full" else 1  # the forward's collectives run again
    block_compute_ns = 3 * layer_fwd_ns + flash_ns + recompute_ns[layout.recompute]
    head_ns = 3 * costs.head_fwd_ns

    seq_local = model.seq_len // layout.cp
    tp_bytes = ledger.tp_allreduce_bytes(model.micro_batch, seq_local, model.hidden, PARAM_BYTES)
    tp_ns = float(costs.collective_ns("all_reduce", tp_bytes, layout.tp, where.tp))
    block_tp_ns = (2 * forwards + 2) * tp_ns
    kv_bytes = ledger.cp_kv_bytes(model.micro_batch, seq_local, model.kv_hidden, PARAM_BYTES)
    cp_ns = float(costs.collective_ns("all_gather", kv_bytes, layout.cp, where.cp))
    block_cp_ns = (forwards + 1) * cp_ns  # gather in forward, reduce-scatter in backward
    block_ep_ns = 0.0
    if model.experts and layout.ep > 1:
        tokens = model.micro_batch * seq_local
        a2a = ledger.ep_alltoall_bytes(tokens, model.topk, model.hidden, PARAM_BYTES)
        a2a_ns = float(costs.collective_ns("all_to_all", a2a, layout.ep, where.ep))
        block_ep_ns = 2 * (forwards + 1) * a2a_ns
    gather_ns = 0.0
    if layout.zero >= 3 and layout.dp > 1:
        gather = ledger.zero3_allgather_bytes(block_params(job, layout), PARAM_BYTES)
        gather_ns = float(costs.collective_ns("all_gather", gather, layout.dp, where.dp))

    def zero_ns(blocks: int) -> float:
        """ZeRO-3's gathers prefetched under the previous block; the first of each pass waits."""
        if not gather_ns:
            return 0.0
        hidden_fwd = max(gather_ns - layer_fwd_ns, 0.0)
        hidden_bwd = max(2 * gather_ns - 2 * layer_fwd_ns, 0.0)  # gather + reduce-scatter
        return 2 * gather_ns + (blocks - 1) * (forwards * hidden_fwd + hidden_bwd)

    # each of its v chunks passes a micro-batch forward and backward (and forward again under
    # full recomputation), each pass at a fixed cost beside its FLOPs (0 unless calibrated)
    pass_ns = layout.v * (forwards + 1) * cluster.pass_overhead_s / NS

    def parts(stage: Stage) -> tuple[float, float, float, float, float]:
        """One micro-batch on `stage`: compute, TP, CP, EP, ZeRO-3 (ns)."""
        n = stage.blocks
        compute = n * block_compute_ns + (head_ns if stage.head else 0.0) + pass_ns
        return compute, n * block_tp_ns, n * block_cp_ns, n * block_ep_ns, zero_ns(n)

    m, p, v = layout.microbatches, layout.pp, layout.v
    split = pipeline_stages(job, layout)
    heaviest = max(split, key=lambda stage: sum(parts(stage)))
    mb_compute_ns, mb_tp_ns, mb_cp_ns, mb_ep_ns, mb_zero_ns = parts(heaviest)
    mb_ns = sum(parts(heaviest))
    # the fill and drain are the other stages' work: the mean stage
    bubble_ns = (p - 1) / v * _mean_stage_ns(split, p, parts)
    boundary = boundary_bytes(job, layout)
    p2p_ns = float(costs.collective_ns("send", boundary, 2, where.pp)) if p > 1 else 0.0
    # each of the v m chunk passes waits for one activation in and one gradient in (the
    # transfer starts when both ends are there, as in the engine), and the fill and the drain
    # for p - 1 more each: interleaving multiplies the messages by v (Narayanan 2021, 2.2)
    pp_p2p_ns = 2 * (v * m + p - 1) * p2p_ns if p > 1 else 0.0

    params = stage_params(job, layout)
    experts = stage_expert_params(job, layout)
    dense = params - experts
    groups = DpGroups(layout.dp, expert_dp(layout), where.dp)
    dp_ns, gather_step_ns = 0.0, 0.0
    if layout.dp > 1 and layout.zero < 3:
        bwd_ns = mb_ns * 2 / 3
        op = "all_reduce" if layout.zero == 0 else "reduce_scatter"
        reductions = job.framework.reductions(layout.zero, layout.pp, m)
        grad_bytes = job.framework.state_at(layout.zero, layout.pp).reduce_bytes
        dp_ns = reductions * _exposed_dp_ns(costs, op, dense, experts, groups, bwd_ns, grad_bytes)
        if layout.zero >= 1:  # the updated parameters, gathered after the optimizer
            gather_step_ns = _exposed_dp_ns(costs, "all_gather", dense, experts, groups, 0.0)
    opt_params = zero_sharded(dense, experts, layout, 1)
    return StepTime(
        compute_s=m * mb_compute_ns * NS,
        tp_s=m * mb_tp_ns * NS,
        cp_s=m * mb_cp_ns * NS,
        ep_s=m * mb_ep_ns * NS,
        zero_s=(m * mb_zero_ns + gather_step_ns) * NS,
        pp_bubble_s=bubble_ns * NS,
        pp_p2p_s=pp_p2p_ns * NS,
        dp_s=dp_ns * NS,
        optimizer_s=costs.optimizer_ns(opt_params) * NS,
        overhead_s=cluster.overhead_s,
    )


def _mean_stage_ns(
    split: tuple[Stage, ...], pp: int, parts: Callable[[Stage], tuple[float, ...]]
) -> float:
    """A micro-batch on the mean of the pp stages: the first, the last, and pp - 2 like the
    second (`split` holds those three; fewer when pp < 3)."""
    if pp == 1:
        return sum(parts(split[0]))
    first, last = sum(parts(split[0])), sum(parts(split[-1]))
    middle = sum(parts(split[1])) if pp > 2 else 0.0
    return (first + last + (pp - 2) * middle) / pp


@dataclass(frozen=True)
class DpGroups:
    """The groups a GPU's gradients reduce over: dense over dp, experts over dp / ep."""

    dp: int
    expert_dp: int
    cross: bool  # whether they span nodes (the dp group's placement for both)


def _exposed_dp_ns(
    costs: Costs,
    op: str,
    dense_params: float,
    expert_params: float,
    groups: DpGroups,
    backward_ns: float,
    bytes_per_param: float = PARAM_BYTES,
) -> float:
    """The engine's DDP: buckets become ready evenly over a backward; each collective (`op`
    on the dense part over dp, then the experts' over dp / ep, `bytes_per_param` each: 4 where
    the framework reduces fp32 gradients) starts when it is ready and the previous one is
    done; what ends after the backward shows (all of it at backward_ns 0)."""
    dense_bytes = dense_params * bytes_per_param
    expert_bytes = expert_params * bytes_per_param
    count = min(max(1, math.ceil((dense_bytes + expert_bytes) / BUCKET_BYTES)), MAX_BUCKETS)
    cost = float(costs.collective_ns(op, dense_bytes / count, groups.dp, groups.cross))
    if expert_bytes > 0:  # a group of one (dp = ep) has nothing to reduce: 0
        cost += float(costs.collective_ns(op, expert_bytes / count, groups.expert_dp, groups.cross))
    done = 0.0
    for i in range(count):
        ready = backward_ns * (i + 1) / count
        done = max(done, ready) + cost
    return max(done - backward_ns, 0.0)
