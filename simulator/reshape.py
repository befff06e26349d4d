"""A simulated run rewritten into shapes other writers give their data, for tests with ground
truth on data the project did not shape (`diag simulate --tags megatron --untraced GROUP`):

- Megatron's names on the pipeline's messages (`forward-send`, `forward-recv`,
  `backward-send`, `backward-recv`) and no tag on collectives;
- a group's collectives left out of the records, so that the time a rank waited in them is
  time in no record.

The simulator knows what each of its records means (its own `act`/`grad` tags), so it may read
them here; the analysis never does.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from diag.contract import schema
from diag.rankfile.convert import convert_run, rank_file, rank_records

TAG_STYLES = ("ours", "megatron")
_MEGATRON_P2P = {
    ("send", "act"): "forward-send",
    ("recv", "act"): "forward-recv",
    ("send", "grad"): "backward-send",
    ("recv", "grad"): "backward-recv",
}


def reshape_run(run_dir: Path, tags: str = "ours", untraced: Iterable[str] = ()) -> None:
    """Rewrite the rank files of `run_dir` in place (their format kept)."""
    dropped = set(untraced)
    if tags == "ours" and not dropped:
        return
    manifest = schema.read_manifest(run_dir)
    arrow = False
    for rank in range(manifest.world_size):
        path = rank_file(run_dir, rank)
        if path is None:
            continue
        arrow = arrow or path.suffix != schema.RANK_FILE_SUFFIX
        records = rank_records(path)
        left_out = [(r["t0"], r["t1"]) for r in records if _untraced(r, dropped)]
        kept = [_renamed(r, tags) for r in records
                if not _untraced(r, dropped) and not _wait_on(r, left_out)]  # fmt: skip
        _rewrite(run_dir, rank, path, kept)
    if arrow:
        convert_run(run_dir, "arrow")


def _rewrite(run_dir: Path, rank: int, path: Path, records: list[dict[str, Any]]) -> None:
    """Replace `rank`'s file (`path`, either format) with `records` as JSON lines; the caller
    converts the run back to Arrow where it was."""
    target = run_dir / schema.rank_file_name(rank)
    temporary = target.with_suffix(".tmp")
    with temporary.open("w") as out:
        out.writelines(json.dumps(record) + "\n" for record in records)
    os.replace(temporary, target)
    if path != target:
        path.unlink()


def _untraced(record: dict[str, Any], groups: set[str]) -> bool:
    return record.get("kind") == schema.RecordKind.COMM.value and record.get("group") in groups


def _wait_on(record: dict[str, Any], intervals: list[tuple[int, int]]) -> bool:
    """A `comm_wait` span within a left-out collective: that collective's wait, left out too
    (the rank waited with nothing recorded)."""
    if record.get("kind") != schema.RecordKind.SPAN.value:
        return False
    if record.get("phase") != schema.Phase.COMM_WAIT.value:
        return False
    t0, t1 = record["t0"], record["t1"]
    return any(a <= t0 and t1 <= b for a, b in intervals)


def _renamed(record: dict[str, Any], tags: str) -> dict[str, Any]:
    if tags != "megatron" or record.get("kind") != schema.RecordKind.COMM.value:
        return record
    op, tag = record.get("op"), record.get("tag")
    return {**record, "tag": _MEGATRON_P2P.get((str(op), str(tag)))}


STEP_END_SYNC_NS = 100_000
"""How long each of the two collectives that close a hidden wait lasts (0.1 ms)."""
ONE_MEMBER_GROUP = "cp"
"""The axis of the one-member groups a hidden wait ends in: context parallelism, which the
simulator never uses (cp=1: a group of one rank each, as a job tracing one rank per group sees)."""


def hide_waits(run_dir: Path, group: str, resume_spread_ms: float = 0.0, seed: int = 0) -> None:
    """Rewrite `run_dir` (JSON lines or Arrow, the format kept) as a job that records only the
    end of `group`'s gradient synchronisation writes it (issue 41's Megatron job): the
    asynchronous collectives of `group` and the waits on them become time in no record, and
    each wait's end becomes a 0.1 ms all-reduce in a one-member group followed by a 0.1 ms
    blocking all-reduce of `group`. The first has no recorded dependency (no other member
    recorded it); the time before it is a wait only the ranks' resuming together shows.

    `resume_spread_ms`: each rank resumes a uniform draw of 0 to this many ms after its wait
    ended (`seed`, the rank and the step draw it: a wake-up, or unrecorded work of its own
    after the wait), so that the ranks resume apart, not together; the blocking all-reduce
    that follows meets them again, and every later record of the rank is that much later (the
    same for every rank: the records stay those of one job)."""
    manifest = schema.read_manifest(run_dir)
    spread_ns = int(resume_spread_ms * 1e6)
    arrow = False
    for rank in range(manifest.world_size):
        path = rank_file(run_dir, rank)
        if path is None:
            continue
        arrow = arrow or path.suffix != schema.RANK_FILE_SUFFIX
        records = rank_records(path)
        hidden = [r for r in records if _untraced(r, {group}) and r.get("async")]
        intervals = [(r["t0"], r["t1"]) for r in hidden]
        ends = sorted({int(r["t1"]) for r in records if _ends_a_hidden_wait(r, intervals)})
        kept: list[dict[str, Any]] = []
        for record in records:
            if any(record is h for h in hidden):
                continue
            if _ends_a_hidden_wait(record, intervals):
                size = len(_members_of(manifest, group, rank))
                late = _resume_delay_ns(spread_ns, seed, rank, record["step"])
                at = _shifted(record, ends, spread_ns)  # by the waits before this one
                kept += _step_end_syncs(at, group, size, late, spread_ns)
                continue
            kept.append(record)
        placed = [_is_end_sync(r) for r in kept]  # (takes the marks off)
        if spread_ns:
            kept = [r if done else _shifted(r, ends, spread_ns)
                    for r, done in zip(kept, placed, strict=True)]  # fmt: skip
        _rewrite(run_dir, rank, path, kept)
    one_member = [[r] for r in range(manifest.world_size)]
    groups = {**manifest.groups, ONE_MEMBER_GROUP: one_member}
    schema.write_manifest(run_dir, dataclasses.replace(manifest, groups=groups))
    if arrow:
        convert_run(run_dir, "arrow")


def _wait_ending(record: dict[str, Any], intervals: list[tuple[int, int]]) -> bool:
    """A `comm_wait` span that ends when a hidden collective does (the wait on the last of a
    step's buckets, begun before it was launched)."""
    if record.get("kind") != schema.RecordKind.SPAN.value:
        return False
    if record.get("phase") != schema.Phase.COMM_WAIT.value:
        return False
    return any(record["t1"] == b for _, b in intervals)


def _members_of(manifest: schema.Manifest, group: str, rank: int) -> list[int]:
    return next((list(m) for m in manifest.groups.get(group, []) if rank in m), [rank])


def _ends_a_hidden_wait(record: dict[str, Any], intervals: list[tuple[int, int]]) -> bool:
    return _wait_on(record, intervals) or _wait_ending(record, intervals)


def _resume_delay_ns(spread_ns: int, seed: int, rank: int, step: int) -> int:
    """How long after its wait ended `rank` resumes in `step`: uniform in [0, spread_ns]."""
    if spread_ns <= 0:
        return 0
    return int(np.random.default_rng((seed, rank, int(step))).integers(0, spread_ns + 1))


def _shifted(record: dict[str, Any], ends: list[int], spread_ns: int) -> dict[str, Any]:
    """`record` with each of its times later by `spread_ns` per hidden wait that ended before
    it (a time at a wait's end counts as after it where it starts a record)."""
    out = dict(record)
    if "t0" in out and out["t0"] is not None:
        out["t0"] = int(out["t0"]) + spread_ns * bisect.bisect_right(ends, int(out["t0"]))
    if "t1" in out and out["t1"] is not None:
        moved = int(out["t1"]) + spread_ns * bisect.bisect_left(ends, int(out["t1"]))
        out["t1"] = max(moved, out.get("t0", moved))
    if "t" in out and isinstance(out["t"], int):
        out["t"] = int(out["t"]) + spread_ns * bisect.bisect_right(ends, int(out["t"]))
    return out


_END_SYNC = "_end_sync"
"""Marks the records `_step_end_syncs` made (already placed), removed before writing."""


def _is_end_sync(record: dict[str, Any]) -> bool:
    return bool(record.pop(_END_SYNC, False))


def _step_end_syncs(
    wait: dict[str, Any], group: str, size: int, late_ns: int = 0, spread_ns: int = 0
) -> list[dict[str, Any]]:
    """The two records a hidden wait ends in: the one-member all-reduce 0.1 ms long, `late_ns`
    after the wait's end (0: within its last 0.2 ms), then the blocking all-reduce of `group`
    until every member can have come (`spread_ns` after the wait's end)."""
    end, step = int(wait["t1"]), wait["step"]
    resume = end - 2 * STEP_END_SYNC_NS + late_ns
    common = {"kind": schema.RecordKind.COMM.value, "step": step,
              "op": schema.CollectiveOp.ALL_REDUCE.value, "bytes": 4, "dtype": "float32",
              "expected_bytes": None, "tag": None, "async": False, "blocking": True,
              _END_SYNC: True}  # fmt: skip
    return [
        {**common, "group": ONE_MEMBER_GROUP, "group_size": 1,
         "t0": resume, "t1": resume + STEP_END_SYNC_NS},
        {**common, "group": group, "group_size": size, "t0": resume + STEP_END_SYNC_NS,
         "t1": end + spread_ns},
    ]  # fmt: skip
