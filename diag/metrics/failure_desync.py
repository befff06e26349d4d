"""Desynchronised collectives (diag/metrics/failure.py): completed collectives of one group
whose op, bytes or dtype differ across its members at the same position, and Flight Recorder
entries of one (group, seq) that differ across ranks (its analyser's classes: type, size and
dtype mismatch). The stuck collectives' own mismatches are diag/metrics/failure_stuck.py's.
"""

from __future__ import annotations

from typing import Any

from diag.metrics.failure_records import DESYNC_TAIL, RankRecords, Stuck, as_int
from diag.metrics.failure_stuck import signature
from diag.read.load import RunData


def troubled(run: RunData, ranks: dict[int, RankRecords], stuck: list[Stuck]) -> bool:
    """Whether the records show the job in trouble: a collective stuck, an exception or a
    stall, or a run that neither closed every rank nor says it completed."""
    if stuck or any(i.exception or i.stall for i in ranks.values()):
        return True
    closed = all(i.closed == "complete" for i in ranks.values())
    return not closed and run.manifest.status != "complete"


def completed_desync(run: RunData) -> list[dict[str, Any]]:
    """Completed collectives of a manifest group whose op, bytes or dtype differ across its
    members at the same position (the k-th collective each issued on it), from the end."""
    comms = run.comms
    if comms.empty or not run.manifest.groups:
        return []
    found: list[dict[str, Any]] = []
    ordered = comms.sort_values(["rank", "t0"], kind="stable")
    for label, lists in run.manifest.groups.items():
        mine = ordered[ordered["group"].astype(str) == label]
        if mine.empty:
            continue
        per_rank = {int(r): f for r, f in mine.groupby("rank")}
        for members in lists:
            rows = [per_rank.get(m) for m in members]
            if len(members) < 2 or any(r is None for r in rows):
                continue
            common = min(len(r) for r in rows if r is not None)
            start = max(0, common - DESYNC_TAIL)
            keys = [
                [signature(*k) for k in zip(r["op"].astype(str).iloc[start:common],
                                             r["bytes"].iloc[start:common],
                                             r["dtype"].astype(str).iloc[start:common],
                                             strict=True)]
                for r in rows if r is not None
            ]  # fmt: skip
            for k in range(common - start):
                at = [key[k] for key in keys]
                if len(set(at)) > 1:
                    found += desync_at(label, start + k + 1, members, at, rows, k + start)
                    break
    return found


def desync_at(label: str, seq: int, members: list[int], at: list[tuple], rows: list, index: int
               ) -> list[dict[str, Any]]:  # fmt: skip
    common = max(set(at), key=at.count)
    out = []
    for member, key, frame in zip(members, at, rows, strict=True):
        if key != common:
            kind = "type" if key[0] != common[0] else "size" if key[1] != common[1] else "dtype"
            out.append({"class": f"{kind} mismatch", "group": label, "seq": seq,
                        "step": int(frame["step"].iloc[index]), "rank": member, "op": key[0],
                        "bytes": as_int(key[1]), "dtype": key[2],
                        "expected": {"op": common[0], "bytes": as_int(common[1]),
                                     "dtype": common[2]}})  # fmt: skip
    return out


def fr_desync(run: RunData) -> list[dict[str, Any]]:
    """Flight Recorder entries of one (group, seq) whose op, size or dtype differ across
    ranks (its analyser's classes: type, size and dtype mismatch)."""
    table = run.flight_recorder
    if table is None or table.empty:
        return []
    found: list[dict[str, Any]] = []
    table = table[~table["p2p"].astype(bool)]
    signatures = [
        signature(*k) for k in zip(table["op"], table["sizes"], table["dtype"], strict=True)
    ]
    history = {  # per group, how often each signature occurs: a tie goes to the usual one
        group: [signatures[i] for i in rows]
        for group, rows in table.reset_index(drop=True).groupby("group").indices.items()
    }
    for (group, seq), rows in table.groupby(["group", "seq"], sort=True):
        keys = [signature(*k) for k in zip(rows["op"], rows["sizes"], rows["dtype"], strict=True)]
        if len(set(keys)) < 2:
            continue
        usual = history.get(group, [])
        common = max(sorted(set(keys), key=str), key=lambda k: (keys.count(k), usual.count(k)))
        for rank, key in zip(rows["rank"], keys, strict=True):
            if key != common:
                kind = "type" if key[0] != common[0] else "size" if key[1] != common[1] else "dtype"
                found.append({"class": f"{kind} mismatch", "group": str(group), "seq": int(seq),
                              "step": None, "rank": int(rank), "op": key[0], "sizes": key[1],
                              "dtype": key[2], "source": "flight recorder",
                              "expected": {"op": common[0], "sizes": common[1],
                                           "dtype": common[2]}})  # fmt: skip
        if len(found) >= 64:
            break
    return found
