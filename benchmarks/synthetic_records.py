"""The synthetic run's records (benchmarks/synthetic_run.py): one rank's JSON lines, in the order
and the form the collectors write them, from the simulated timeline, losses and expert load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from benchmarks.synthetic_model import (
    DTYPE,
    DTYPE_BYTES,
    MOE_LAYERS,
    RANKS_PER_HOST,
    RUN_START_NS,
    RunShape,
    host_of,
    param_count,
)
from benchmarks.synthetic_simulate import ExpertLoad, Timeline, activations_measured, memory_bytes
from diag.contract.schema import CollectiveOp, Phase, RecordKind

HOST_RSS_BYTES = 1_200_000_000  # interpreter, torch and data loader, beside the model state
SYNTHETIC_PID = 40_000
MB_PHASES = (Phase.DATA.value, Phase.FWD.value, Phase.BWD.value)


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
