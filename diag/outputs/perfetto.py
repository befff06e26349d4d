"""A run as a Chrome trace-event file, for Perfetto (ui.perfetto.dev) and `chrome://tracing`.

The format is the Trace Event Format (the JSON that Kineto, HTA, TraceLens and nsys-ai export):
- one process per rank (`pid` = rank), named `rank R (host H, stage S)` and sorted by rank;
- its threads are tracks: `compute` (spans: fwd, bwd, opt, data, comm_wait; kernels from a
  profiler trace), `collectives` (one slice per collective), `findings`; spans that overlap on
  one rank (async collectives in flight together, kernels on several streams) go to a second
  track of the kind, `compute (2)`, since a track draws properly nested slices only;
- memory as counters (`ph` "C", MiB): the six categories of each mem record at its step's end;
- flow arrows (`ph` "s" -> "f") from the member of each matched collective that arrived last
  (diag/whatif/matching.py: the n-th collective of one op in one group is one collective on
  every member) to each other member, which waited for it; and from each pipeline send to the
  receive it feeds;
- each finding as an instant event on the `findings` track of the ranks it blames, or as one
  global instant (`s` "g") when it blames none.

Times are microseconds from the first record of the window (`otherData.origin_ns`), written with
three decimals: exact to the nanosecond (every span's t0 and t1 come back as they were,
tests/unit/test_perfetto.py reads the file with diag's own trace reader).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.errors import InputError
from diag.read.load import RunData
from diag.whatif.matching import collective_instances, message_pairs

SCHEMA = "diag.perfetto/1"
NS_PER_US = 1000
MIB = 2**20
TID_FINDINGS = 0
TID_COMPUTE = 1  # first compute track; further ones follow
TID_COLLECTIVES = 1001  # first collectives track
MAX_TRACKS = 999
"""Tracks of one kind per rank at most; a span overlapping all of them joins the last one."""


def trace_events(
    run: RunData,
    stages: dict[int, int] | None = None,
    findings: Sequence[dict[str, Any]] = (),
    steps: range | None = None,
) -> dict[str, Any]:
    """The trace-event document of `run` (its steps in `steps`, when given): `traceEvents` and
    `otherData` (schema, run id, origin_ns, the window). `stages` names each rank's pipeline
    stage; `findings` are the report's (their `ranks` get the instants)."""
    spans, comms = _window(run.spans, steps), _window(run.comms, steps)
    records = _window(run.steps, steps)
    starts = [int(t["t0"].min()) for t in (spans, comms, records) if not t.empty]
    origin_ns = min(starts, default=0)
    ranks = sorted(
        {int(r) for t in (spans, comms, records) for r in t["rank"].unique()}
        | {r.rank for r in run.manifest.ranks}
    )
    events: list[dict[str, Any]] = [*_processes(run.manifest, ranks, stages or {})]
    slices = _slices(spans, comms, origin_ns)
    events += slices.events
    instants = list(_finding_instants(findings, ranks, slices.tracks))  # adds findings tracks
    events += _thread_names(slices.tracks)
    events += _memory_counters(_window(run.memory, steps), records, origin_ns)
    events += _flows(comms, run.manifest, slices)
    events += instants
    window = None if steps is None else [steps.start, steps.stop]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schema": SCHEMA, "run_id": run.manifest.run_id, "origin_ns": origin_ns,
                      "steps": window},
    }  # fmt: skip


def write_trace(path: str | Path, document: dict[str, Any]) -> None:
    """Write the document as JSON, gzip-compressed when the name ends in `.gz`; InputError
    (one line) when it cannot be written."""
    target = Path(path)
    data = json.dumps(document, separators=(",", ":"), allow_nan=False).encode("utf-8")
    try:
        if target.name.endswith(".gz"):
            with gzip.open(target, "wb", compresslevel=6) as fh:
                fh.write(data)
        else:
            target.write_bytes(data)
    except OSError as err:
        raise InputError(target, f"cannot write ({err.strerror or err})") from None


def _window(table: pd.DataFrame, steps: range | None) -> pd.DataFrame:
    if steps is None or table.empty:
        return table
    step = table["step"].to_numpy()
    return table[(step >= steps.start) & (step < steps.stop)]


def _us(ns: Any, origin_ns: int) -> float:
    """Microseconds from the origin, rounded to the nanosecond (three decimals)."""
    return round((int(ns) - origin_ns) / NS_PER_US, 3)


def _processes(
    manifest: schema.Manifest, ranks: Sequence[int], stages: dict[int, int]
) -> Iterator[dict[str, Any]]:
    hosts = {r.rank: r.host for r in manifest.ranks}
    for rank in ranks:
        where = [f"host {hosts[rank]}"] if hosts.get(rank) else []
        where += [f"stage {stages[rank]}"] if rank in stages else []
        name = f"rank {rank}" + (f" ({', '.join(where)})" if where else "")
        yield {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": name}}
        yield {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
               "args": {"sort_index": rank}}  # fmt: skip


class _Slices:
    """The complete ('X') events of spans and collectives, the tracks they went to, and where
    each collective record (by its row label in `comms`) was placed: (pid, tid, ts, end)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.tracks: dict[int, set[int]] = {}  # rank -> tids used
        self.placed: dict[Any, tuple[int, int, float, float]] = {}


def _lanes(t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """For intervals sorted by start, the first track free at each start (greedy): a track
    holds intervals that do not overlap."""
    ends: list[int] = []
    out = np.zeros(len(t0), dtype=np.int64)
    for i, (start, end) in enumerate(zip(t0.tolist(), t1.tolist(), strict=True)):
        for lane, busy_until in enumerate(ends):
            if busy_until <= start:
                ends[lane], out[i] = end, lane
                break
        else:
            if len(ends) < MAX_TRACKS:
                ends.append(end)
            out[i] = len(ends) - 1
            ends[-1] = max(ends[-1], end)
    return out


def _slices(spans: pd.DataFrame, comms: pd.DataFrame, origin_ns: int) -> _Slices:
    out = _Slices()
    for rank, group in spans.sort_values(["rank", "t0"], kind="stable").groupby("rank"):
        lanes = _lanes(group["t0"].to_numpy(), group["t1"].to_numpy())
        for lane, row in zip(lanes.tolist(), group.itertuples(index=False), strict=True):
            tid = TID_COMPUTE + lane
            out.tracks.setdefault(int(rank), set()).add(tid)
            mb = None if pd.isna(row.mb) else int(row.mb)
            name = str(row.phase) + ("" if mb is None else f" mb {mb}")
            out.events.append({
                "ph": "X", "cat": "span", "name": name,
                "pid": int(rank), "tid": tid, "ts": _us(row.t0, origin_ns),
                "dur": _us(row.t1, int(row.t0)),
                "args": {"rank": int(rank), "step": int(row.step), "phase": str(row.phase),
                         "mb": mb, "stage": _int(row.stage), "chunk": _int(row.chunk)},
            })  # fmt: skip
    ordered = comms.sort_values(["rank", "t0"], kind="stable")
    for rank, group in ordered.groupby("rank"):
        lanes = _lanes(group["t0"].to_numpy(), group["t1"].to_numpy())
        for lane, (label, row) in zip(lanes.tolist(), group.iterrows(), strict=True):
            tid = TID_COLLECTIVES + lane
            out.tracks.setdefault(int(rank), set()).add(tid)
            ts, dur = _us(row["t0"], origin_ns), _us(row["t1"], int(row["t0"]))
            out.placed[label] = (int(rank), tid, ts, ts + dur)
            tag = None if pd.isna(row["tag"]) else str(row["tag"])
            out.events.append({
                "ph": "X", "cat": "collective",
                "name": " ".join(str(p) for p in (row["op"], row["group"], tag) if p is not None),
                "pid": int(rank), "tid": tid, "ts": ts, "dur": dur,
                "args": {"rank": int(rank), "step": int(row["step"]), "op": str(row["op"]),
                         "group": None if pd.isna(row["group"]) else str(row["group"]),
                         "tag": tag, "bytes": _int(row["bytes"]),
                         "expected_bytes": _int(row["expected_bytes"])},
            })  # fmt: skip
    return out


def _int(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def _thread_names(tracks: dict[int, set[int]]) -> Iterator[dict[str, Any]]:
    for rank, tids in sorted(tracks.items()):
        for tid in sorted(tids | {TID_FINDINGS}):
            if tid == TID_FINDINGS:
                name = "findings"
            elif tid < TID_COLLECTIVES:
                name = "compute" + ("" if tid == TID_COMPUTE else f" ({tid - TID_COMPUTE + 1})")
            else:
                lane = tid - TID_COLLECTIVES + 1
                name = "collectives" + ("" if lane == 1 else f" ({lane})")
            yield {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                   "args": {"name": name}}  # fmt: skip
            yield {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                   "args": {"sort_index": tid}}  # fmt: skip


def _memory_counters(
    memory: pd.DataFrame, steps: pd.DataFrame, origin_ns: int
) -> Iterator[dict[str, Any]]:
    """One counter event per mem record, at the end of its rank's step (mem records carry a
    step, not a time), the measured categories in MiB (a category not measured is left out)."""
    if memory.empty or steps.empty:
        return
    ends = steps.groupby(["rank", "step"])["t1"].max()
    columns = list(schema.MEMORY_CATEGORIES)
    for row in memory.itertuples(index=False):
        end = ends.get((row.rank, row.step))
        if end is None:
            continue
        values = {c: round(float(getattr(row, c)) / MIB, 3) for c in columns
                  if pd.notna(getattr(row, c))}  # fmt: skip
        if values:
            yield {"ph": "C", "name": "memory MiB", "pid": int(row.rank), "tid": 0,
                   "ts": _us(end, origin_ns), "args": values}  # fmt: skip


def _flows(
    comms: pd.DataFrame, manifest: schema.Manifest, slices: _Slices
) -> Iterator[dict[str, Any]]:
    """Arrows from the last member to arrive at each matched collective to the others, and from
    each pipeline send to its receive. A flow's end sits inside the receiving slice, at the
    moment the arrow's source started (clamped to the slice): when the waiting could end."""
    if comms.empty:
        return
    flow_id = 0
    labels = comms.index.to_numpy()
    instance = collective_instances(comms, manifest)
    matched = pd.DataFrame({"label": labels, "instance": instance, "t0": comms["t0"].to_numpy()})
    matched = matched[matched["instance"] >= 0]
    for _, members in matched.groupby("instance", sort=False):
        last = members.loc[members["t0"].idxmax(), "label"]
        for label in members["label"]:
            if label != last:
                flow_id += 1
                yield from _arrow(flow_id, slices.placed[last], slices.placed[label], "arrival")
    for recv, send in message_pairs(comms, manifest).items():
        flow_id += 1
        yield from _arrow(flow_id, slices.placed[labels[send]], slices.placed[labels[recv]],
                          "message")  # fmt: skip


def _arrow(
    flow_id: int, source: tuple[int, int, float, float], target: tuple[int, int, float, float],
    kind: str,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    pid, tid, ts, _ = source
    to_pid, to_tid, to_start, to_end = target
    name = "last arrival" if kind == "arrival" else "send -> recv"
    yield {"ph": "s", "id": flow_id, "cat": kind, "name": name, "pid": pid, "tid": tid, "ts": ts}
    yield {"ph": "f", "bp": "e", "id": flow_id, "cat": kind, "name": name, "pid": to_pid,
           "tid": to_tid, "ts": min(max(ts, to_start), to_end)}  # fmt: skip


def _finding_instants(
    findings: Sequence[dict[str, Any]], ranks: Sequence[int], tracks: dict[int, set[int]]
) -> Iterator[dict[str, Any]]:
    """Each finding at the window's start (ts 0), on the findings track of every rank it blames, or
    as one global instant when it blames none."""
    known = set(ranks)
    for finding in findings:
        name = f"{finding.get('rule', '')} {finding.get('title', '')}".strip()
        args = {k: finding.get(k) for k in ("rule", "severity", "pattern", "cost_s", "cost_share",
                                             "advice", "ranks")}  # fmt: skip
        blamed = [int(r) for r in finding.get("ranks") or [] if int(r) in known]
        if not blamed:
            yield {"ph": "i", "s": "g", "cat": "finding", "name": name, "pid": 0,
                   "tid": TID_FINDINGS, "ts": 0.0, "args": args}  # fmt: skip
        for rank in blamed:
            tracks.setdefault(rank, set())
            yield {"ph": "i", "s": "t", "cat": "finding", "name": name, "pid": rank,
                   "tid": TID_FINDINGS, "ts": 0.0, "args": args}  # fmt: skip
