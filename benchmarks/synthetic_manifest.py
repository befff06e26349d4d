"""The synthetic run's manifest (benchmarks/synthetic_run.py): the layout, model, hosts and
groups of a data-parallel (or, with experts, an ep = 1) run, and the command that wrote it."""

from __future__ import annotations

import shlex
from pathlib import Path

from benchmarks.synthetic_model import (
    AUX_LOSS_COEF,
    BUCKET_MB,
    CAPACITY_FACTOR,
    DTYPE,
    FFN_HIDDEN,
    HEADS,
    HIDDEN,
    INTER_NODE_GBPS,
    INTRA_NODE_GBPS,
    LAYERS,
    MICRO_BATCH,
    RANKS_PER_HOST,
    RUN_CREATED,
    SEQ_LEN,
    VOCAB,
    RunShape,
    host_of,
    param_count,
)
from benchmarks.synthetic_simulate import BWD_NS, FWD_NS, STRAGGLER_FACTOR
from diag.contract.schema import Hardware, Layout, Manifest, ModelInfo, RankInfo, RunStatus


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


def _command_line(run_dir: Path, shape: RunShape) -> str:
    straggler = "none" if shape.straggler_rank is None else str(shape.straggler_rank)
    return shlex.join([
        "python", "benchmarks/synthetic_run.py", str(run_dir), "--ranks", str(shape.ranks),
        "--steps", str(shape.steps), "--microbatches", str(shape.microbatches),
        "--experts", str(shape.experts), "--straggler-rank", straggler, "--seed", str(shape.seed),
    ])  # fmt: skip
