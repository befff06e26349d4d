"""Memory per GPU in the six categories (docs/metrics.md) for one layout, from the ledger.

Static state is 16 B/param (SEED §1) of the parameters the GPU's stage holds after tensor,
pipeline and expert splits, with ZeRO's divisions over dp: stage 1 the 12 B of optimizer
state, stage 2 also the 2 B of gradients, stage 3 also the 2 B of parameters. Activations are
Korthikanti 2022's per layer (diag.ledger) times the layers of the heaviest stage times the
micro-batches the schedule keeps in flight (1F1B: about p, independent of m; interleaved a
little more: `diag.schedules.peak_in_flight` of the real order), plus the fp32 logits on the
last stage. Buffers as the simulator counts them; fragmentation a share of the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from diag import ledger
from diag.plan.job import Job, Layout
from diag.schedules import peak_in_flight, schedule_order
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

    @property
    def static_bytes(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total_bytes(self) -> float:
        return self.static_bytes + self.activations + self.comm_buffers + self.fragmentation

    def as_dict(self) -> dict[str, float]:
        return {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "comm_buffers": self.comm_buffers,
            "fragmentation": self.fragmentation,
            "total": self.total_bytes,
        }


def layers_per_gpu(job: Job, layout: Layout) -> int:
    """Blocks on the heaviest pipeline GPU: ceil(L / (p v)) per chunk, v chunks (an uneven
    split puts the extra layers somewhere; the heaviest stage paces the pipeline)."""
    return math.ceil(job.model.layers / (layout.pp * layout.v)) * layout.v


def block_params(job: Job, layout: Layout) -> float:
    """One block's parameters on one GPU (its TP shard, its experts)."""
    return layer_params(job.model, layout.tp, layout.ep).total * job.param_scale


def stage_params(job: Job, layout: Layout) -> float:
    """Parameters on the heaviest GPU: its blocks plus the embedding or the head."""
    m, tp = job.model, layout.tp
    embedding = m.vocab * m.hidden / tp + (m.seq_len * m.hidden if m.learned_positions else 0)
    head = m.vocab * m.hidden / tp if (layout.pp > 1 or not m.tied_embeddings) else 0.0
    head += 2 * m.hidden  # final LayerNorm
    ends = embedding + head if layout.pp == 1 else max(embedding, head)
    return layers_per_gpu(job, layout) * block_params(job, layout) + ends * job.param_scale


SCHEDULE_REPLAY_LIMIT = 4096
"""Above this many micro-batch chunks the closed form stands in for replaying the order."""


@lru_cache(maxsize=4096)
def microbatches_in_flight(pp: int, microbatches: int, v: int) -> int:
    """Model chunks whose forward activations stage 0 holds at once (its peak): the real
    order's, or for long orders its closed form (1F1B: min(m, p); interleaved: Megatron's
    warm-up (p-1) x 2 + (v-1) x p + 1; tests/unit/test_plan.py holds the two equal)."""
    if pp == 1:
        return 1
    if microbatches * v > SCHEDULE_REPLAY_LIMIT:
        return in_flight_closed_form(pp, microbatches, v)
    schedule = "interleaved" if v > 1 else "1f1b"
    return peak_in_flight(schedule_order(schedule, 0, pp, microbatches, v))


def in_flight_closed_form(pp: int, microbatches: int, v: int) -> int:
    if v == 1:
        return min(microbatches, pp)
    return min(microbatches * v, (pp - 1) * 2 + (v - 1) * pp + 1)


def activation_bytes(job: Job, layout: Layout) -> float:
    """Activations on the heaviest GPU at its peak."""
    m = job.model
    sp = layout.sequence_parallel and layout.tp > 1
    per_layer = ledger.activation_bytes_per_layer(
        max(m.seq_len // layout.cp, 1),
        job.micro_batch,
        m.hidden,
        m.heads,
        layout.tp,
        sp,
        layout.recompute,
    )
    chunks = microbatches_in_flight(layout.pp, layout.microbatches, layout.v)
    per_chunk = layers_per_gpu(job, layout) // layout.v
    logits = job.micro_batch * m.seq_len / layout.cp * m.vocab / layout.tp * 4  # fp32
    return per_layer * per_chunk * chunks + logits


def comm_buffer_bytes(job: Job, layout: Layout, params: float) -> float:
    """DDP's flat gradient buffer, pipeline send/receive buffers, ZeRO-3's gathered units,
    the all-to-all buffers of expert parallelism (at the capacity factor)."""
    m = job.model
    buffers = 0.0
    if layout.dp > 1 and layout.zero < 2:
        buffers += params * GRAD_BYTES
    boundary = ledger.pp_boundary_bytes(job.micro_batch, m.seq_len // layout.cp, m.hidden, 2)
    if layout.pp > 1:
        buffers += 2 * boundary
    if layout.zero >= 3 and layout.dp > 1:  # this unit and the prefetched next one
        buffers += 2 * ledger.zero3_allgather_bytes(block_params(job, layout), PARAM_BYTES)
    if layout.ep > 1:
        tokens = job.micro_batch * m.seq_len // layout.cp
        a2a = ledger.ep_alltoall_bytes(tokens, m.topk, m.hidden, PARAM_BYTES)
        buffers += 4 * a2a * m.capacity_factor
    return buffers


def memory_per_gpu(job: Job, layout: Layout) -> MemoryPerGpu:
    """The six categories on the heaviest GPU of `layout`."""
    params = stage_params(job, layout)
    dp = layout.dp
    state = ledger.static_state_bytes(params)  # 16 B/param before ZeRO
    weights = params * PARAM_BYTES / (dp if layout.zero >= 3 else 1)
    grads = params * GRAD_BYTES / (dp if layout.zero >= 2 else 1)
    optimizer = (state - params * (PARAM_BYTES + GRAD_BYTES)) / (dp if layout.zero >= 1 else 1)
    activations = activation_bytes(job, layout)
    buffers = comm_buffer_bytes(job, layout, params)
    allocated = weights + grads + optimizer + activations + buffers
    return MemoryPerGpu(
        weights, grads, optimizer, activations, buffers, allocated * FRAGMENTATION_SHARE
    )
