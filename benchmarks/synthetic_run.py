"""A synthetic run directory (`diag.run/1`): a data-parallel job of many ranks with one straggler,
written in seconds, for benchmarks of the analysis and the dashboard at a size no test machine
can train.

    python benchmarks/synthetic_run.py OUT [--ranks 64] [--steps 200] [--experts 8]
        [--microbatches 4] [--straggler-rank 1 | --straggler-rank none] [--seed 0]

What the ranks do per step, as the DP reference trainer and its recording DDP hook would record
it (docs/run-format.md):
- `microbatches` x spans `data`, `fwd`, `bwd` (gradient accumulation, `mb` = the index),
- one DDP bucket (the model's gradients fit in `bucket_mb`): an async `all_reduce` on group `dp`
  launched when the last backward ends, `bytes` == `expected_bytes` == params x 4 (float32),
  and the hook's `comm_wait` span from that launch to the all-reduce's completion,
- `opt`, then the `mem` record (six categories, fragmentation and device_peak null on CPU,
  activations measured on the first 3 steps and every 10th as the collectors do) and the `step`
  record (tokens, loss),
- with `experts` > 0, one `experts` record per MoE layer (2 layers) with the tokens routed to
  each expert, the dropped assignments, the per-call capacity and the aux loss.

Times are an alpha-beta model of a small GPT on CPU ranks (about 100 ms a step), with a few per
cent of seeded jitter per span. The straggler's forward and backward take 1.5x as long; the
all-reduce completes only once it joins, so every other rank waits for it in `comm_wait`.
With `experts` > 0 every rank holds every expert (layout ep = 1, like the ep trainer with
`--ep 1`: plain data parallelism), so each rank writes the expert load of its own tokens.
Output is deterministic for given arguments and seed.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diag import ledger
from diag.schema import (
    MANIFEST_FILE,
    RANK_FILE_RE,
    CollectiveOp,
    Hardware,
    Layout,
    Manifest,
    ModelInfo,
    Phase,
    RankInfo,
    RecordKind,
    RunStatus,
    rank_file_name,
    write_manifest,
)

RANKS_PER_HOST = 8
RUN_START_NS = 1_767_225_600 * 10**9
"""2026-01-01T00:00:00Z: the run's clock (ns since the epoch) at the first step."""
RUN_CREATED = "2026-01-01T00:00:00+00:00"

# The model: a small GPT in float32, as the reference trainers run on CPU.
LAYERS, HIDDEN, HEADS, SEQ_LEN, MICRO_BATCH, VOCAB = 4, 256, 4, 256, 8, 8192
FFN_HIDDEN = 4 * HIDDEN
DTYPE, DTYPE_BYTES = "float32", 4
MOE_LAYERS = (1, 3)  # every other block's MLP is a MoE layer
TOPK, CAPACITY_FACTOR, AUX_LOSS_COEF = 2, 1.25, 0.01
EXPERT_LOAD_CONCENTRATION = 50.0
"""Dirichlet concentration of each layer's router preference: max/mean load ~1.2 at 8 experts."""
BUCKET_MB = 64.0  # the gradients (22 MB dense, 51 MB with 8 experts) fit one bucket

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

# All-reduce: ring over gloo, latency per hop and bandwidth per rank.
HOP_LATENCY_NS = 20_000
INTRA_NODE_GBPS, INTER_NODE_GBPS = 10.0, 3.0
COMPLETION_SKEW_NS = 100_000  # ranks leave the ring up to this much apart

HOST_RSS_BYTES = 1_200_000_000  # interpreter, torch and data loader, beside the model state
HOST_RSS_NOISE_BYTES = 2_000_000
ACTIVATION_EVERY = 10  # the collectors' default: activations on steps < 3 and every 10th
SYNTHETIC_PID = 40_000
MB_PHASES = (Phase.DATA.value, Phase.FWD.value, Phase.BWD.value)


@dataclass(frozen=True)
class RunShape:
    """The arguments of one synthetic run."""

    ranks: int
    steps: int
    microbatches: int
    experts: int
    straggler_rank: int | None
    seed: int

    @property
    def tokens_per_microbatch(self) -> int:
        return MICRO_BATCH * SEQ_LEN

    @property
    def tokens_per_step(self) -> int:
        return self.tokens_per_microbatch * self.microbatches

    @property
    def topk(self) -> int:
        return min(TOPK, self.experts)


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


# --- Manifest -----------------------------------------------------------------------------------


def param_count(experts: int) -> int:
    """The GPT's parameters; a MoE layer holds `experts` MLPs and a router instead of one MLP."""
    dense = ledger.gpt_param_count(LAYERS, HIDDEN, VOCAB, SEQ_LEN, FFN_HIDDEN)
    if experts <= 0:
        return dense
    mlp = 2 * HIDDEN * FFN_HIDDEN + FFN_HIDDEN + HIDDEN
    router = HIDDEN * experts
    return dense + len(MOE_LAYERS) * ((experts - 1) * mlp + router)


def build_manifest(run_dir: Path, shape: RunShape) -> Manifest:
    everyone = list(range(shape.ranks))
    groups = {"dp": [everyone], "world": [everyone]} if shape.ranks > 1 else {"world": [everyone]}
    model = ModelInfo(
        layers=LAYERS, hidden=HIDDEN, heads=HEADS, seq_len=SEQ_LEN, micro_batch=MICRO_BATCH,
        vocab=VOCAB, ffn_hidden=FFN_HIDDEN, params=param_count(shape.experts), dtype=DTYPE,
        attention="sdpa",
    )  # fmt: skip
    if shape.experts > 0:
        model.experts, model.topk = shape.experts, shape.topk
        model.capacity_factor, model.aux_loss_coef = CAPACITY_FACTOR, AUX_LOSS_COEF
    return Manifest(
        run_id=run_dir.resolve().name,
        created=RUN_CREATED,
        world_size=shape.ranks,
        trainer="ep" if shape.experts > 0 else "dp",
        command=_command_line(run_dir, shape),
        backend="gloo",
        device_type="cpu",
        layout=Layout(
            dp=shape.ranks,
            ep=1,
            microbatches=shape.microbatches,
            grad_accum=shape.microbatches,
            bucket_mb=BUCKET_MB,
        ),
        model=model,
        ranks=[
            RankInfo(rank=r, host=host_of(r), local_rank=r % RANKS_PER_HOST, device_name="cpu")
            for r in everyone
        ],
        groups=groups,
        hardware=Hardware(
            gpus_per_node=RANKS_PER_HOST,
            intra_node_GBps=INTRA_NODE_GBPS,
            inter_node_GBps=INTER_NODE_GBPS,
        ),
        injections=[straggler_spec(shape.straggler_rank)]
        if shape.straggler_rank is not None
        else [],
        status=RunStatus.COMPLETE.value,
        steps_completed=shape.steps,
    )


def straggler_spec(rank: int) -> str:
    """The `--inject` spec that slows a rank as much: M ms more compute per micro-batch."""
    extra_ms = (STRAGGLER_FACTOR - 1) * (FWD_NS + BWD_NS) / 1e6
    return f"straggler:rank={rank},ms={extra_ms:g}"


def host_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_HOST}"


def _command_line(run_dir: Path, shape: RunShape) -> str:
    straggler = "none" if shape.straggler_rank is None else str(shape.straggler_rank)
    return shlex.join([
        "python", "benchmarks/synthetic_run.py", str(run_dir), "--ranks", str(shape.ranks),
        "--steps", str(shape.steps), "--microbatches", str(shape.microbatches),
        "--experts", str(shape.experts), "--straggler-rank", straggler, "--seed", str(shape.seed),
    ])  # fmt: skip


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


# --- Records ------------------------------------------------------------------------------------


def meta_record(shape: RunShape, rank: int, rng: np.random.Generator) -> dict[str, Any]:
    host = host_of(rank)
    correction_ns = 0 if rank < RANKS_PER_HOST else int(rng.integers(-50_000, 50_000))
    return {
        "kind": "meta",
        "step": None,
        "rank": rank,
        "world_size": shape.ranks,
        "host": host,
        "physical_host": host,
        "local_rank": rank % RANKS_PER_HOST,
        "pid": SYNTHETIC_PID + rank,
        "clock_offset_ns": RUN_START_NS - 1_000_000_000 * (1 + rank % RANKS_PER_HOST),
        "clock_correction_ns": correction_ns,
    }


def span_record(step: int, phase: str, t0: int, t1: int, mb: int | None = None) -> dict[str, Any]:
    return {
        "kind": RecordKind.SPAN.value,
        "step": step,
        "phase": phase,
        "mb": mb,
        "stage": None,
        "chunk": None,
        "t0": t0,
        "t1": t1,
    }


def allreduce_record(step: int, ranks: int, payload_bytes: int, t0: int, t1: int) -> dict[str, Any]:
    """The DDP hook's record of the step's one gradient bucket."""
    return {
        "kind": RecordKind.COMM.value,
        "step": step,
        "op": CollectiveOp.ALL_REDUCE.value,
        "group": "dp",
        "group_size": ranks,
        "bytes": payload_bytes,
        "dtype": DTYPE,
        "t0": t0,
        "t1": t1,
        "expected_bytes": payload_bytes,
        "tag": "grad",
        "async": True,
        "blocking": False,
    }


def rank_records(
    shape: RunShape,
    rank: int,
    timeline: Timeline,
    losses: np.ndarray,
    load: ExpertLoad | None,
    rss_noise_bytes: np.ndarray,
    rng: np.random.Generator,
) -> Iterator[dict[str, Any]]:
    """One rank's records in the order the collectors write them."""
    yield meta_record(shape, rank, rng)
    payload_bytes = param_count(shape.experts) * DTYPE_BYTES
    memory = memory_bytes(shape.experts)
    state_bytes = sum(v or 0 for k, v in memory.items() if k != "activations")
    mb_spans = timeline.mb_spans_ns[:, rank].tolist()
    comms = timeline.comm_ns[:, rank].tolist()
    opts = timeline.opt_ns[:, rank].tolist()
    steps = timeline.step_ns[:, rank].tolist()
    rank_losses = losses[:, rank].tolist()
    rss = rss_noise_bytes[:, rank].tolist()
    for step in range(shape.steps):
        for mb, phases in enumerate(mb_spans[step]):
            for phase, (t0, t1) in zip(MB_PHASES, phases, strict=True):
                yield span_record(step, phase, t0, t1, mb)
        if shape.ranks > 1:
            c0, c1 = comms[step]
            yield allreduce_record(step, shape.ranks, payload_bytes, c0, c1)
            yield {**span_record(step, Phase.COMM_WAIT.value, c0, c1), "source": "ddp_hook"}
        if load is not None:
            yield from expert_records(load, step, rank)
        yield span_record(step, Phase.OPT.value, *opts[step])
        activations = memory["activations"] if activations_measured(step) else None
        yield {
            "kind": RecordKind.MEM.value,
            "step": step,
            **memory,
            "activations": activations,
            "device_peak": None,
            "host_rss": HOST_RSS_BYTES + state_bytes + int(rss[step]),
            "source": "tensors",
        }
        t0, t1 = steps[step]
        yield {
            "kind": RecordKind.STEP.value,
            "step": step,
            "t0": t0,
            "t1": t1,
            "tokens": shape.tokens_per_step,
            "loss": rank_losses[step],
        }


def expert_records(load: ExpertLoad, step: int, rank: int) -> Iterator[dict[str, Any]]:
    for index, layer in enumerate(MOE_LAYERS):
        yield {
            "kind": RecordKind.EXPERTS.value,
            "step": step,
            "layer": layer,
            "tokens": load.tokens[index, step, rank].tolist(),
            "dropped": int(load.dropped[index, step, rank]),
            "capacity": load.capacity,
            "aux_loss": float(load.aux_loss[index, step, rank]),
        }


def rank_text(records: Iterator[dict[str, Any]]) -> str:
    """JSON lines as the collectors' RankWriter writes them (compact separators)."""
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


# --- Entry points -------------------------------------------------------------------------------


def write_synthetic_run(
    out: Path,
    ranks: int = 64,
    steps: int = 200,
    *,
    microbatches: int = 4,
    experts: int = 0,
    straggler_rank: int | None = 1,
    seed: int = 0,
) -> Path:
    """Write a complete run directory at `out` (created; rank files of an earlier run there are
    removed) and return `out`. Raises ValueError on impossible arguments."""
    shape = RunShape(ranks, steps, microbatches, experts, straggler_rank, seed)
    _check(shape)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _remove_old_run(out)
    rng = np.random.default_rng(seed)
    timeline = simulate_timeline(shape, rng)
    losses = simulate_losses(shape, rng)
    load = simulate_expert_load(shape, rng) if experts > 0 else None
    rss_noise_bytes = rng.normal(0.0, HOST_RSS_NOISE_BYTES, (steps, ranks))
    for rank in range(ranks):
        records = rank_records(shape, rank, timeline, losses, load, rss_noise_bytes, rng)
        (out / rank_file_name(rank)).write_text(rank_text(records), encoding="utf-8")
    write_manifest(out, build_manifest(out, shape))
    return out


def _check(shape: RunShape) -> None:
    if shape.ranks < 1 or shape.steps < 1 or shape.microbatches < 1:
        raise ValueError(
            f"ranks, steps and microbatches must be >= 1, got {shape.ranks}, {shape.steps}, "
            f"{shape.microbatches}"
        )
    if shape.experts < 0 or shape.experts == 1:
        raise ValueError(f"experts must be 0 (a dense model) or >= 2, got {shape.experts}")
    if shape.straggler_rank is not None and not 0 <= shape.straggler_rank < shape.ranks:
        raise ValueError(f"straggler rank {shape.straggler_rank} is not in 0..{shape.ranks - 1}")


def _remove_old_run(out: Path) -> None:
    for path in out.iterdir():
        if RANK_FILE_RE.match(path.name) or path.name == MANIFEST_FILE:
            path.unlink()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", type=Path, help="run directory to write (created)")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--experts", type=int, default=0, help="experts per MoE layer (0: dense)")
    p.add_argument(
        "--straggler-rank", default="1", help="the rank that computes 1.5x longer, or 'none'"
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        args.straggler_rank = None if args.straggler_rank == "none" else int(args.straggler_rank)
    except ValueError:
        p.error(f"--straggler-rank must be a rank or 'none', got {args.straggler_rank!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_s = time.perf_counter()
    try:
        out = write_synthetic_run(
            args.out, args.ranks, args.steps, microbatches=args.microbatches,
            experts=args.experts, straggler_rank=args.straggler_rank, seed=args.seed,
        )  # fmt: skip
    except ValueError as err:
        print(f"synthetic_run: error: {err}", file=sys.stderr)
        return 2
    elapsed_s = time.perf_counter() - started_s
    size_bytes = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(
        f"wrote {out}: {args.ranks} ranks x {args.steps} steps, {size_bytes / 2**20:.1f} MiB "
        f"in {elapsed_s:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
