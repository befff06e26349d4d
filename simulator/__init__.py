"""A discrete-event cluster simulator: a run directory (`diag.run/1`) of a job of any size.

    from simulator import ModelSpec, SimConfig, simulate
    result = simulate(SimConfig(dp=128, pp=4, tp=2, microbatches=8, steps=100), "runs/sim")

Compute from FLOPs over a device rate, every collective's bytes from the ledger over the
intra- or inter-node link its group sits on, the pipeline schedule's dependencies, and the
injections of `diag run`. See docs/simulator.md for the model, its defaults and its limits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diag.contract.schema import write_manifest
from simulator.config import ModelSpec, SimConfig, SimulationError, model_params
from simulator.engine import Engine
from simulator.hardware import HardwareSpec
from simulator.injections import parse_faults, stage_of_ranks
from simulator.writer import RUN_START_NS, RankFiles, build_manifest, finish, meta_line, prepare

if TYPE_CHECKING:  # pyarrow and pandas only where a run is written as Arrow: `diag plan`
    from simulator.arrow_writer import ArrowRankFiles  # reads the config without them

__all__ = [
    "HardwareSpec",
    "ModelSpec",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "model_params",
    "simulate",
]


@dataclass(frozen=True)
class SimResult:
    path: Path
    world_size: int
    steps: int
    records: int  # lines written over all rank files
    bytes: int  # bytes written over all rank files
    seconds: float  # wall time of the simulation and the writing


def simulate(
    config: SimConfig, out: str | Path, command: str | None = None, format: str = "arrow"
) -> SimResult:
    """Simulate `config` and write its run directory at `out` (created; the manifest and rank
    files of an earlier run there are replaced), its rank files in `format` ("arrow", the
    default, simulator/arrow_writer.py, or "jsonl"). SimulationError (one line) when the
    configuration cannot be simulated."""
    if format not in ("jsonl", "arrow"):
        raise SimulationError(f"rank file format {format!r}, expected arrow or jsonl")
    started = time.perf_counter()
    config.check()
    try:
        faults = parse_faults(
            config.inject, config.world_size, config.model.experts,
            stages=stage_of_ranks(config), seed=config.seed,
        )  # fmt: skip
    except ValueError as err:
        raise SimulationError(str(err)) from None
    engine = Engine(config, faults)
    path = Path(out)
    prepare(path)
    buckets = engine.grad_buckets[0]
    bucket_mb = max(buckets) / 2**20 if buckets else None
    manifest = build_manifest(path, config, command, bucket_mb)
    write_manifest(path, manifest)
    files: RankFiles | ArrowRankFiles
    if format == "arrow":
        from simulator.arrow_writer import ArrowRankFiles

        metas = [meta_line(config, r) for r in range(config.world_size)]
        files = ArrowRankFiles(path, config, engine.stage_ranks, metas, RUN_START_NS)
    else:
        files = RankFiles(path, config, engine.stage_ranks)
    for _step, batches in engine.steps():
        files.add_step(batches)
    files.flush(last=True)
    finish(path, manifest, config.steps)
    return SimResult(
        path, config.world_size, config.steps, files.records, files.bytes,
        time.perf_counter() - started,
    )  # fmt: skip
