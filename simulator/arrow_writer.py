"""The simulated run's rank files as Arrow IPC streams (`rank-NNNNN.arrows`,
diag/rankfile/arrow_format.py): each step's records of every rank become one record batch of one row
a rank, built from whole columns (the engine's batches share their fixed fields over many ranks),
never record by record."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from diag.rankfile import arrow_format
from simulator.config import SimConfig
from simulator.records import Batch
from simulator.writer import write_buffers

FLUSH_RECORDS = 2_000_000
"""Buffered records at which the rank files are appended to (bounds memory at any scale)."""
_TIMES = ("t0", "t1")


class _KindParts:
    """One kind's batches of a step: each batch's fixed fields, its ranks and its times."""

    def __init__(self) -> None:
        self.fields: list[dict[str, Any]] = []
        self.ranks: list[np.ndarray] = []
        self.times: list[tuple[np.ndarray, np.ndarray] | None] = []
        self.vary: list[tuple[str, np.ndarray] | None] = []


class ArrowRankFiles:
    """Per-rank buffers of encapsulated record batches, appended to the rank files now and
    then (the interface of simulator.writer.RankFiles)."""

    def __init__(
        self, out: Path, config: SimConfig, stages: list[np.ndarray], meta_lines: list[bytes],
        start_ns: int,
    ) -> None:  # fmt: skip
        self.world = config.world_size
        self.paths = [out / arrow_format.rank_file_name(r) for r in range(self.world)]
        header = arrow_format.stream_header()
        self.buffers: list[list[bytes]] = [[header] for _ in range(self.world)]
        self._meta: list[str] | None = [line.decode().rstrip("\n") for line in meta_lines]
        self.start_ns = start_ns
        self._stage_ids = {id(ranks) for ranks in stages}
        self._heads: dict[bytes, dict[str, Any]] = {}
        self.pending = 0
        self.records = self.world
        self.bytes = 0
        self._started = False

    def add_step(self, batches: list[Batch]) -> None:
        parts: dict[str, _KindParts] = defaultdict(_KindParts)
        # each rank's records in the order the JSONL writer gives them: the batches of other
        # rank sets first, then those of its pipeline stage (RankFiles.add_step)
        staged = [id(batch.ranks) in self._stage_ids for batch in batches]
        ordered = [b for b, s in zip(batches, staged, strict=True) if not s]
        ordered += [b for b, s in zip(batches, staged, strict=True) if s]
        for batch in ordered:
            fields = self._heads.get(batch.head)
            if fields is None:
                fields = self._heads[batch.head] = msgspec.json.decode(batch.head + b"}")
            kind = parts[fields["kind"]]
            ranks = np.asarray(batch.ranks).ravel()
            kind.fields.append(fields)
            kind.ranks.append(ranks)
            if batch.t0 is not None and batch.t1 is not None:
                t0, t1 = (np.rint(np.ravel(t)).astype(np.int64) + self.start_ns
                          for t in (batch.t0, batch.t1))  # fmt: skip
                kind.times.append((t0, t1))
            else:
                kind.times.append(None)
            vary = batch.vary
            kind.vary.append(None if vary is None else (vary[0], np.asarray(vary[1]).ravel()))
            self.records += ranks.size
            self.pending += ranks.size
        tables = {name: _columns(name, part) for name, part in parts.items()
                  if name in arrow_format.KIND_FIELDS}  # fmt: skip
        step = arrow_format.encode_columns(self.world, tables, self._meta)
        self._meta = None
        for rank, buffer in enumerate(self.buffers):
            buffer.append(step.slice(rank, 1).serialize().to_pybytes())
        if self.pending >= FLUSH_RECORDS:
            self.flush()

    def flush(self, last: bool = False) -> None:
        if last:
            for parts in self.buffers:
                parts.append(arrow_format.END_OF_STREAM)
        self.bytes += write_buffers(self.paths, self.buffers, append=self._started)
        self._started = True
        self.pending = 0


def _columns(kind: str, part: _KindParts) -> tuple[np.ndarray, dict[str, pa.Array]]:
    """A kind's records of one step over all ranks, ordered by rank (stable: each rank's in
    the engine's order), as typed arrays by field."""
    counts = np.array([r.size for r in part.ranks], dtype=np.int64)
    ranks = np.concatenate(part.ranks) if part.ranks else np.zeros(0, np.int64)
    order = np.argsort(ranks, kind="stable")
    batch_of = np.repeat(np.arange(len(counts)), counts)
    arrays: dict[str, pa.Array] = {}
    typed = {name: kind_of for name, kind_of in arrow_format.KIND_FIELDS[kind]}
    for name, kind_of in typed.items():
        if name in _TIMES:
            at = _TIMES.index(name)
            values = np.concatenate([
                t[at] if t is not None else np.zeros(n, np.int64)
                for t, n in zip(part.times, counts.tolist(), strict=True)
            ])  # fmt: skip
            missing = np.repeat([t is None for t in part.times], counts)
            arrays[name] = pa.array(values[order], mask=missing[order] if missing.any() else None)
            continue
        constants = pa.array([f.get(name) for f in part.fields], type=kind_of)
        column = pc.take(constants, pa.array(batch_of[order]))
        varying = [i for i, v in enumerate(part.vary) if v is not None and v[0] == name]
        if varying:
            column = _with_varying(column, name, kind_of, part, counts, order, varying)
        arrays[name] = column
    arrays[arrow_format.EXTRA] = _extra(part, typed, counts, order)
    return ranks[order], arrays


def _with_varying(
    column: pa.Array, name: str, kind_of: pa.DataType, part: _KindParts,
    counts: np.ndarray, order: np.ndarray, varying: list[int],
) -> pa.Array:  # fmt: skip
    """A typed column whose value differs per rank in some batches (`Batch.vary`)."""
    values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
    starts = np.concatenate([[0], np.cumsum(counts)])
    where = np.empty(len(order), dtype=np.int64)
    where[order] = np.arange(len(order))  # engine position -> rank-ordered position
    for i in varying:
        vary = part.vary[i]
        assert vary is not None
        values[where[starts[i] : starts[i + 1]]] = vary[1].tolist()
    return pa.array(values.tolist(), type=kind_of)


def _extra(
    part: _KindParts, typed: dict[str, pa.DataType], counts: np.ndarray, order: np.ndarray
) -> pa.Array:
    """Each record's fields beyond the typed ones, as JSON object text (null when none)."""
    texts: list[str | None] = []
    position = np.zeros(len(counts), dtype=np.int64)  # each batch's text (its first one)
    varying: list[int] = []
    for i, (fields, vary) in enumerate(zip(part.fields, part.vary, strict=True)):
        rest = {k: v for k, v in fields.items() if k not in typed and k != "kind"}
        position[i] = len(texts)
        if vary is None or vary[0] in typed:
            texts.append(json.dumps(rest, separators=(",", ":")) if rest else None)
        else:
            varying.append(i)
            texts += [json.dumps({**rest, vary[0]: v}, separators=(",", ":"))
                      for v in vary[1].tolist()]  # fmt: skip
    index = np.repeat(position, counts)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for i in varying:  # one text per record: consecutive from the batch's first
        index[starts[i] : starts[i + 1]] += np.arange(counts[i])
    return pc.take(pa.array(texts, type=pa.string()), pa.array(index[order]))
