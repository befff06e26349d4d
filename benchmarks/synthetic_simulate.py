"""What the synthetic run's ranks do (benchmarks/synthetic_run.py), simulated with numpy: every
span's times (an alpha-beta model with seeded jitter), the losses, each rank's memory and the
load on each expert."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmarks.synthetic_model import (
    CAPACITY_FACTOR,
    DTYPE_BYTES,
    HEADS,
    HIDDEN,
    INTER_NODE_GBPS,
    INTRA_NODE_GBPS,
    LAYERS,
    MICRO_BATCH,
    MOE_LAYERS,
    RANKS_PER_HOST,
    RUN_START_NS,
    SEQ_LEN,
    VOCAB,
    RunShape,
    param_count,
)
from diag.contract import ledger

EXPERT_LOAD_CONCENTRATION = 50.0
"""Dirichlet concentration of each layer's router preference: max/mean load ~1.2 at 8 experts."""

# Per micro-batch compute (median ns) and the rest of the step.
DATA_NS, FWD_NS, BWD_NS = 400_000, 4_500_000, 9_000_000
OPT_NS = 3_000_000
SPAN_GAP_NS = 30_000  # Python between two spans
STEP_END_NS = 150_000  # memory sampling and the step record, inside the step window
STEP_GAP_NS = 200_000  # the loop between one step's end and the next one's start
JITTER_SIGMA = 0.03  # lognormal sigma of every duration
RANK_SPEED_SIGMA = 0.01  # lognormal sigma of each rank's lasting speed
WARMUP_FACTOR = 3.0  # the first step allocates and warms caches
STRAGGLER_FACTOR = 1.5  # the straggler's fwd and bwd

# All-reduce: ring over gloo, latency per hop (the bandwidths: synthetic_model.py).
HOP_LATENCY_NS = 20_000
COMPLETION_SKEW_NS = 100_000  # ranks leave the ring up to this much apart

ACTIVATION_EVERY = 10  # the collectors' default: activations on steps < 3 and every 10th


@dataclass(frozen=True)
class Timeline:
    """Every interval of the run in ns on the run's clock, indexed [step, rank, ...]."""

    step_ns: np.ndarray  # (S, R, 2): t0, t1
    mb_spans_ns: np.ndarray  # (S, R, M, 3, 2): data, fwd, bwd of each micro-batch
    comm_ns: np.ndarray  # (S, R, 2): the all-reduce, launch to completion (= the comm_wait)
    opt_ns: np.ndarray  # (S, R, 2)


@dataclass(frozen=True)
class ExpertLoad:
    """Per MoE layer: routed assignments per expert, dropped assignments and aux loss."""

    tokens: np.ndarray  # (L, S, R, E): routed to each expert, summed over micro-batches
    dropped: np.ndarray  # (L, S, R)
    aux_loss: np.ndarray  # (L, S, R): mean over micro-batches
    capacity: int  # slots per expert of one micro-batch


# --- Times --------------------------------------------------------------------------------------


def allreduce_ns(ranks: int, payload_bytes: float) -> float:
    """Ring all-reduce: 2(n-1) hops of latency plus the wire bytes over the slowest link."""
    if ranks <= 1:
        return 0.0
    link_GBps = INTER_NODE_GBPS if ranks > RANKS_PER_HOST else INTRA_NODE_GBPS
    wire_bytes = ledger.ring_allreduce_wire_bytes(payload_bytes, ranks)
    return 2 * (ranks - 1) * HOP_LATENCY_NS + wire_bytes / link_GBps


def jitter(rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
    return rng.lognormal(0.0, JITTER_SIGMA, size)


def simulate_timeline(shape: RunShape, rng: np.random.Generator) -> Timeline:
    """Step by step: each rank computes its micro-batches, the all-reduce completes when the
    last rank has launched it, then every rank steps its optimizer and starts the next step."""
    S, R, M = shape.steps, shape.ranks, shape.microbatches
    base_ns = np.tile(np.array([DATA_NS, FWD_NS, BWD_NS], dtype=float), M)  # (3M,)
    rank_factor = np.repeat(rng.lognormal(0.0, RANK_SPEED_SIGMA, R)[:, None], 3 * M, axis=1)
    if shape.straggler_rank is not None:
        compute = np.tile([False, True, True], M)
        rank_factor[shape.straggler_rank, compute] *= STRAGGLER_FACTOR
    payload_bytes = param_count(shape.experts) * DTYPE_BYTES
    ring_ns = allreduce_ns(R, payload_bytes)

    step_ns = np.empty((S, R, 2), dtype=np.int64)
    mb_spans_ns = np.empty((S, R, M, 3, 2), dtype=np.int64)
    comm_ns = np.empty((S, R, 2), dtype=np.int64)
    opt_ns = np.empty((S, R, 2), dtype=np.int64)
    start_ns = np.full(R, RUN_START_NS, dtype=np.int64)
    for step in range(S):
        warmup = WARMUP_FACTOR if step == 0 else 1.0
        durations_ns = np.rint(base_ns * rank_factor * jitter(rng, (R, 3 * M)) * warmup)
        gaps_ns = np.rint(SPAN_GAP_NS * jitter(rng, (R, 3 * M)))
        ends_ns = start_ns[:, None] + np.cumsum(gaps_ns + durations_ns, axis=1).astype(np.int64)
        starts_ns = ends_ns - durations_ns.astype(np.int64)
        mb_spans_ns[step, :, :, :, 0] = starts_ns.reshape(R, M, 3)
        mb_spans_ns[step, :, :, :, 1] = ends_ns.reshape(R, M, 3)

        launch_ns = ends_ns[:, -1] + SPAN_GAP_NS
        ring_done_ns = launch_ns.max() + int(ring_ns * warmup * jitter(rng, (1,))[0])
        done_ns = ring_done_ns + rng.integers(0, COMPLETION_SKEW_NS, R)
        comm_ns[step, :, 0], comm_ns[step, :, 1] = launch_ns, done_ns

        opt_start_ns = done_ns + SPAN_GAP_NS
        opt_end_ns = opt_start_ns + np.rint(OPT_NS * warmup * jitter(rng, (R,))).astype(np.int64)
        opt_ns[step, :, 0], opt_ns[step, :, 1] = opt_start_ns, opt_end_ns

        step_ns[step, :, 0], step_ns[step, :, 1] = start_ns, opt_end_ns + STEP_END_NS
        start_ns = step_ns[step, :, 1] + np.rint(STEP_GAP_NS * jitter(rng, (R,))).astype(np.int64)
    return Timeline(step_ns, mb_spans_ns, comm_ns, opt_ns)


# --- Losses, memory, experts --------------------------------------------------------------------


def simulate_losses(shape: RunShape, rng: np.random.Generator) -> np.ndarray:
    """(S, R): from ln(vocab) toward ~3, each rank's loss a little apart from the others'."""
    steps = np.arange(shape.steps, dtype=float)[:, None]
    start = math.log(VOCAB)
    curve = 3.0 + (start - 3.0) * np.exp(-steps / 60.0)
    return curve + rng.normal(0.0, 0.03, (shape.steps, shape.ranks))


def memory_bytes(experts: int) -> dict[str, int | None]:
    """The six categories of every rank (state replicated: plain DP, float32, AdamW)."""
    params = param_count(experts)
    activations = ledger.activation_bytes_per_layer(SEQ_LEN, MICRO_BATCH, HIDDEN, HEADS)
    return {
        "params": params * DTYPE_BYTES,
        "grads": params * DTYPE_BYTES,
        "optimizer": 2 * params * DTYPE_BYTES,  # AdamW's exp_avg and exp_avg_sq
        # the ledger counts 16-bit activations; these are float32
        "activations": int(activations * LAYERS * DTYPE_BYTES / 2),
        "comm_buffers": params * DTYPE_BYTES,  # the one DDP bucket's flat buffer
        "fragmentation": None,
    }


def activations_measured(step: int) -> bool:
    return step < 3 or step % ACTIVATION_EVERY == 0


def simulate_expert_load(shape: RunShape, rng: np.random.Generator) -> ExpertLoad:
    """Each layer's router prefers some experts a little; every micro-batch routes its tokens x
    topk assignments, and those beyond an expert's capacity are dropped."""
    E, M = shape.experts, shape.microbatches
    assignments = shape.tokens_per_microbatch * shape.topk
    capacity = math.ceil(round(CAPACITY_FACTOR * shape.tokens_per_microbatch * shape.topk / E, 9))
    tokens, dropped, aux_loss = [], [], []
    for _ in MOE_LAYERS:
        preference = rng.dirichlet(np.full(E, EXPERT_LOAD_CONCENTRATION))
        counts = rng.multinomial(assignments, preference, size=(shape.steps, shape.ranks, M))
        tokens.append(counts.sum(axis=2))
        dropped.append(np.clip(counts - capacity, 0, None).sum(axis=(2, 3)))
        shares = counts / assignments
        aux_loss.append((E * (shares * preference).sum(axis=3)).mean(axis=2))
    return ExpertLoad(np.stack(tokens), np.stack(dropped), np.stack(aux_loss), capacity)
