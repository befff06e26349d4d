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

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def hide_waits(run_dir: Path, group: str) -> None:
    """Rewrite `run_dir` (JSON lines or Arrow, the format kept) as a job that records only the
    end of `group`'s gradient synchronisation writes it (issue 41's Megatron job): the
    asynchronous collectives of `group` and the waits on them become time in no record, and
    each wait's end becomes a 0.1 ms all-reduce in a one-member group followed by a 0.1 ms
    blocking all-reduce of `group`. The first has no recorded dependency (no other member
    recorded it); the time before it is a wait only the ranks' resuming together shows."""
    manifest = schema.read_manifest(run_dir)
    arrow = False
    for rank in range(manifest.world_size):
        path = rank_file(run_dir, rank)
        if path is None:
            continue
        arrow = arrow or path.suffix != schema.RANK_FILE_SUFFIX
        records = rank_records(path)
        hidden = [r for r in records if _untraced(r, {group}) and r.get("async")]
        intervals = [(r["t0"], r["t1"]) for r in hidden]
        kept: list[dict[str, Any]] = []
        for record in records:
            if any(record is h for h in hidden):
                continue
            if _wait_on(record, intervals) or _wait_ending(record, intervals):
                kept += _step_end_syncs(record, group, len(_members_of(manifest, group, rank)))
                continue
            kept.append(record)
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


def _step_end_syncs(wait: dict[str, Any], group: str, size: int) -> list[dict[str, Any]]:
    """The two records a hidden wait ends in, within its last 0.2 ms."""
    end, step = int(wait["t1"]), wait["step"]
    common = {"kind": schema.RecordKind.COMM.value, "step": step,
              "op": schema.CollectiveOp.ALL_REDUCE.value, "bytes": 4, "dtype": "float32",
              "expected_bytes": None, "tag": None, "async": False, "blocking": True}  # fmt: skip
    return [
        {**common, "group": ONE_MEMBER_GROUP, "group_size": 1,
         "t0": end - 2 * STEP_END_SYNC_NS, "t1": end - STEP_END_SYNC_NS},
        {**common, "group": group, "group_size": size, "t0": end - STEP_END_SYNC_NS, "t1": end},
    ]  # fmt: skip
