"""Predicted step time of one layout, in the simulator's cost model, and the FLOPs behind MFU.

The pieces are `simulator.costs.Costs`'s: compute from FLOPs over the device's achieved rate,
each collective `latency + payload x bus_factor / (link GB/s x NCCL efficiency)` on the
intra- or inter-node link its group sits on, the optimizer over HBM bandwidth. They are
composed as `simulator.engine` runs them, in closed form for the heaviest stage (the engine
replays every rank; tests/unit/test_plan_engine.py holds the two together):
- a micro-batch is its layers' forward and backward (twice the forward), with the TP
  all-reduces on the critical path (2 per layer forward, 2 backward), context parallelism's
  key/value gathers, expert parallelism's 4 all-to-alls per layer, ZeRO-3's parameter
  gathers where the layer's compute does not hide them, and the recomputed forward;
- a pipeline runs m + (p-1)/v micro-batch slots (the bubble is the (p-1)/v extra) and pays
  one activation and one gradient transfer per boundary on the critical path;
- DDP's gradient buckets all-reduce during the last backward (at most 4 buckets, ready evenly
  over it, as the engine does): what outlasts the backward is exposed;
- then the optimizer, then a fixed host overhead per step (0 unless calibrated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from diag import ledger
from diag.plan.job import Cluster, Job, Layout
from diag.plan.memory import PARAM_BYTES, block_params, layers_per_gpu, stage_params
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
    zero_s: float  # ZeRO-3 parameter gathers not hidden under compute
    pp_bubble_s: float
    pp_p2p_s: float
    dp_s: float  # gradient all-reduce not hidden under the last backward
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


def recompute_flops_per_step(job: Job, layout: Layout) -> float:
    """The extra FLOPs recomputation adds: a whole forward (full), the scores (selective)."""
    m = replace(job.model, micro_batch=job.micro_batch)
    mbs = job.global_batch / job.micro_batch
    if layout.recompute == "full":
        return m.layers * layer_forward_flops(job) * mbs
    if layout.recompute == "selective":
        return m.layers * 4 * m.micro_batch * m.seq_len**2 * m.hidden * mbs
    return 0.0


def step_time(job: Job, layout: Layout, cluster: Cluster) -> StepTime:
    """The predicted step of `layout` for `job` on `cluster`."""
    hw = cluster.hardware
    model = replace(job.model, micro_batch=job.micro_batch)
    where = placement(layout, cluster.gpus_per_node)
    # compute divides over tp and cp alike: the simulator's Costs split by their product
    costs = Costs(model, hw, layout.tp * layout.cp)
    rate_per_ns = hw.flops_per_s * NS
    n = layers_per_gpu(job, layout)
    layer_fwd_ns = layer_forward_flops(job) / (layout.tp * layout.cp) / rate_per_ns
    if model.experts:  # each EP rank computes the tokens routed to its experts
        layer_fwd_ns = costs.attn_fwd_ns + costs.router_fwd_ns
        layer_fwd_ns += costs.expert_row_fwd_ns * model.tokens * model.topk
    scores_ns = 4.0 * model.micro_batch * model.seq_len**2 * model.hidden
    scores_ns /= layout.tp * layout.cp * rate_per_ns
    recompute_ns = {"none": 0.0, "selective": scores_ns, "full": layer_fwd_ns}[layout.recompute]
    forwards = 2 if layout.recompute == "full" else 1  # the forward's collectives run again
    mb_compute_ns = n * (3 * layer_fwd_ns + recompute_ns) + 3 * costs.head_fwd_ns

    seq_local = model.seq_len // layout.cp
    tp_bytes = ledger.tp_allreduce_bytes(model.micro_batch, seq_local, model.hidden, PARAM_BYTES)
    tp_ns = float(costs.collective_ns("all_reduce", tp_bytes, layout.tp, where.tp))
    mb_tp_ns = n * (2 * forwards + 2) * tp_ns
    kv_bytes = ledger.cp_kv_bytes(model.micro_batch, seq_local, model.kv_hidden, PARAM_BYTES)
    cp_ns = float(costs.collective_ns("all_gather", kv_bytes, layout.cp, where.cp))
    mb_cp_ns = n * (forwards + 1) * cp_ns  # gather in forward, reduce-scatter in backward
    mb_ep_ns = 0.0
    if model.experts and layout.ep > 1:
        tokens = model.micro_batch * seq_local
        a2a = ledger.ep_alltoall_bytes(tokens, model.topk, model.hidden, PARAM_BYTES)
        mb_ep_ns = (
            n
            * 2
            * (forwards + 1)
            * float(costs.collective_ns("all_to_all", a2a, layout.ep, where.ep))
        )
    mb_zero_ns = 0.0
    if layout.zero >= 3 and layout.dp > 1:
        gather = ledger.zero3_allgather_bytes(block_params(job, layout), PARAM_BYTES)
        gather_ns = float(costs.collective_ns("all_gather", gather, layout.dp, where.dp))
        # prefetched under the previous layer; the first one of each pass waits in full
        hidden_fwd = max(gather_ns - layer_fwd_ns, 0.0)
        hidden_bwd = max(2 * gather_ns - 2 * layer_fwd_ns, 0.0)  # gather + reduce-scatter
        mb_zero_ns = 2 * gather_ns + (n - 1) * (forwards * hidden_fwd + hidden_bwd)

    m, p, v = layout.microbatches, layout.pp, layout.v
    mb_ns = mb_compute_ns + mb_tp_ns + mb_cp_ns + mb_ep_ns + mb_zero_ns
    # the fill and drain are the other stages' work: the mean stage (the head is on one)
    mean_stage_ns = mb_ns - 3 * costs.head_fwd_ns * (p - 1) / p
    bubble_ns = (p - 1) / v * mean_stage_ns
    boundary = ledger.pp_boundary_bytes(model.micro_batch, seq_local, model.hidden, PARAM_BYTES)
    p2p_ns = float(costs.collective_ns("send", boundary, 2, where.pp)) if p > 1 else 0.0
    # each micro-batch slot waits for one activation in and one gradient in
    pp_p2p_ns = 2 * (m + (p - 1) / v) * p2p_ns if p > 1 else 0.0

    params = stage_params(job, layout)
    dp_ns = 0.0
    if layout.dp > 1 and layout.zero < 3:
        last_bwd_ns = mb_ns * 2 / 3
        dp_ns = _exposed_grad_allreduce_ns(
            costs, params * PARAM_BYTES, layout.dp, where.dp, last_bwd_ns
        )
    opt_params = params / layout.dp if layout.zero >= 1 else params
    return StepTime(
        compute_s=m * mb_compute_ns * NS,
        tp_s=m * mb_tp_ns * NS,
        cp_s=m * mb_cp_ns * NS,
        ep_s=m * mb_ep_ns * NS,
        zero_s=m * mb_zero_ns * NS,
        pp_bubble_s=bubble_ns * NS,
        pp_p2p_s=pp_p2p_ns * NS,
        dp_s=dp_ns * NS,
        optimizer_s=costs.optimizer_ns(opt_params) * NS,
        overhead_s=cluster.overhead_s,
    )


def _exposed_grad_allreduce_ns(
    costs: Costs, payload_bytes: float, dp: int, cross: bool, backward_ns: float
) -> float:
    """The engine's DDP: buckets become ready evenly over the last backward; each all-reduce
    starts when it is ready and the previous one is done; what ends after the backward shows."""
    count = min(max(1, math.ceil(payload_bytes / BUCKET_BYTES)), MAX_BUCKETS)
    size = payload_bytes / count
    cost = float(costs.collective_ns("all_reduce", size, dp, cross))
    done = 0.0
    for i in range(count):
        ready = backward_ns * (i + 1) / count
        done = max(done, ready) + cost
    return max(done - backward_ns, 0.0)
