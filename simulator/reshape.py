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
        target = run_dir / schema.rank_file_name(rank)
        temporary = target.with_suffix(".tmp")
        with temporary.open("w") as out:
            out.writelines(json.dumps(record) + "\n" for record in kept)
        os.replace(temporary, target)
        if path != target:
            path.unlink()
    if arrow:
        convert_run(run_dir, "arrow")


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
