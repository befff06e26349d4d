"""The run directory of a simulated job: the manifest and one JSON-lines file per rank, in the
`diag.run/1` contract (docs/run-format.md), written as the collectors would write them."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

import numpy as np

from diag.contract.names import grid_groups, host_name
from diag.contract.schema import (
    MANIFEST_FILE,
    RANK_FILE_RE,
    Hardware,
    Layout,
    Manifest,
    ModelInfo,
    RankInfo,
    RunStatus,
    rank_file_name,
    write_manifest,
)
from simulator.config import SimConfig, model_params
from simulator.records import DTYPE_NAMES, Batch, head

RUN_START_NS = 1_767_225_600 * 10**9
"""2026-01-01T00:00:00Z: the run's clock (ns since the epoch) when the first step starts."""
FLUSH_LINES = 2_000_000
"""Buffered records at which the rank files are appended to (bounds memory at any scale)."""
SIMULATED_PID = 50_000


def groups(config: SimConfig) -> dict[str, list[list[int]]]:
    """The manifest's groups, as Topology.all_groups() names them (axes of size > 1, world)."""
    return grid_groups({"dp": config.dp, "pp": config.pp, "ep": config.ep, "tp": config.tp})


def build_manifest(out: Path, config: SimConfig, command: str | None, bucket_mb: float | None):
    model, hw, k = config.model, config.hardware, config.gpus_per_node
    moe = model.experts > 0
    return Manifest(
        run_id=out.resolve().name,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        world_size=config.world_size,
        trainer="custom",
        command=command,
        backend="nccl",
        device_type="cuda",
        layout=Layout(
            dp=config.dp,
            tp=config.tp,
            pp=config.pp,
            ep=config.ep,
            cp=1,
            zero_stage=config.zero_stage,
            microbatches=config.microbatches,
            schedule=config.schedule if config.pp > 1 else None,
            virtual_stages=config.virtual_stages,
            grad_accum=config.microbatches if config.pp == 1 else 1,
            bucket_mb=bucket_mb,
        ),
        model=ModelInfo(
            layers=model.layers,
            hidden=model.hidden,
            heads=model.heads,
            seq_len=model.seq_len,
            micro_batch=model.micro_batch,
            vocab=model.vocab,
            ffn_hidden=model.ffn,
            experts=model.experts if moe else None,
            topk=model.topk if moe else None,
            capacity_factor=model.capacity_factor if moe else None,
            aux_loss_coef=model.aux_loss_coef if moe else None,
            params=model_params(config),
            dtype=DTYPE_NAMES.get(model.dtype_bytes, model.dtype),
            attention="sdpa",
        ),
        ranks=[
            RankInfo(rank=r, host=host_name(r, k), local_rank=r % k, device_name=hw.device_name)
            for r in range(config.world_size)
        ],
        groups=groups(config),
        hardware=Hardware(
            gpus_per_node=k,
            device_memory_bytes=hw.device_memory_bytes,
            intra_node_GBps=hw.intra_node_GBps,
            inter_node_GBps=hw.inter_node_GBps,
        ),
        injections=list(config.inject),
        status=RunStatus.RUNNING.value,
    )


def meta_line(config: SimConfig, rank: int) -> bytes:
    k = config.gpus_per_node
    host = host_name(rank, k)
    return head({
        "kind": "meta", "step": None, "rank": rank, "world_size": config.world_size,
        "host": host, "physical_host": host, "local_rank": rank % k,
        "pid": SIMULATED_PID + rank, "clock_offset_ns": 0, "clock_correction_ns": 0,
    }) + b"}\n"  # fmt: skip


def _format(batch: Batch) -> tuple[bytes, list[np.ndarray]]:
    """The record's printf-style line and its per-rank integer columns, in the line's order."""
    fmt = batch.head.replace(b"%", b"%%")
    columns: list[np.ndarray] = []
    if batch.vary is not None:
        fmt += b',"' + batch.vary[0].encode() + b'":%d'
        columns.append(np.asarray(batch.vary[1], dtype=np.int64).ravel())
    if batch.t0 is not None and batch.t1 is not None:
        fmt += b',"t0":%d,"t1":%d'
        for times in (batch.t0, batch.t1):
            columns.append(np.rint(np.ravel(times)).astype(np.int64) + RUN_START_NS)
    return fmt + b"}\n", columns


class RankFiles:
    """Per-rank buffers of JSON lines, appended to `rank-NNNNN.jsonl` now and then.

    Most batches cover one whole stage (`stages`: the engine's arrays of a stage's ranks), so
    every rank of the stage writes the same sequence of record shapes in a step: their lines
    are one format string, filled per rank in one `%` operation. Other batches are formatted
    record by record.
    """

    def __init__(self, out: Path, config: SimConfig, stages: list[np.ndarray]) -> None:
        self.paths = [out / rank_file_name(r) for r in range(config.world_size)]
        self.buffers: list[list[bytes]] = [[meta_line(config, r)] for r in range(len(self.paths))]
        self.stages = stages
        self._stage_of = {id(ranks): i for i, ranks in enumerate(stages)}
        self.pending = len(self.paths)
        self.records = len(self.paths)
        self.bytes = 0
        self._started = False

    def add_step(self, batches: list[Batch]) -> None:
        """The records of one step, every rank's in the order of `batches`."""
        formats: list[list[bytes]] = [[] for _ in self.stages]
        columns: list[list[np.ndarray]] = [[] for _ in self.stages]
        for batch in batches:
            stage = self._stage_of.get(id(batch.ranks))
            fmt, values = _format(batch)
            if stage is None:
                self._add_lines(np.asarray(batch.ranks).ravel().tolist(), fmt, values)
                continue
            formats[stage].append(fmt)
            columns[stage].extend(values)
            self.records += batch.ranks.size
            self.pending += batch.ranks.size
        for stage, ranks in enumerate(self.stages):
            if not formats[stage]:
                continue
            template = b"".join(formats[stage])
            if columns[stage]:
                rows = np.stack(columns[stage], axis=1).tolist()
                for r, row in zip(ranks.ravel().tolist(), rows, strict=True):
                    self.buffers[r].append(template % tuple(row))
            else:
                for r in ranks.ravel().tolist():
                    self.buffers[r].append(template)
        if self.pending >= FLUSH_LINES:
            self.flush()

    def _add_lines(self, ranks: list[int], fmt: bytes, columns: list[np.ndarray]) -> None:
        buffers = self.buffers
        if not columns:
            for r in ranks:
                buffers[r].append(fmt)
        else:
            rows = np.stack(columns, axis=1).tolist()
            for r, row in zip(ranks, rows, strict=True):
                buffers[r].append(fmt % tuple(row))
        self.pending += len(ranks)
        self.records += len(ranks)

    def flush(self, last: bool = False) -> None:  # `last`: the Arrow writer's end marker
        self.bytes += write_buffers(self.paths, self.buffers, append=self._started)
        self._started = True
        self.pending = 0


def write_buffers(paths: list[Path], buffers: list[list[bytes]], append: bool) -> int:
    """Write each rank's buffered bytes to its file (appended after the first flush, which
    starts the file anew) and empty the buffers; the bytes written."""
    written = 0
    for path, parts in zip(paths, buffers, strict=True):
        data = b"".join(parts)
        with open(path, "ab" if append else "wb") as stream:
            stream.write(data)
        written += len(data)
        parts.clear()
    return written


def prepare(out: Path) -> None:
    """Create `out`; remove the manifest and rank files of an earlier run there."""
    out.mkdir(parents=True, exist_ok=True)
    for path in out.iterdir():
        if RANK_FILE_RE.match(path.name) or path.name == MANIFEST_FILE:
            os.unlink(path)


def finish(out: Path, manifest: Manifest, steps: int) -> None:
    manifest.status = RunStatus.COMPLETE.value
    manifest.steps_completed = steps
    write_manifest(out, manifest)
