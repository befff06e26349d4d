"""Desynchronised collectives (diag/metrics/failure.py): completed collectives of one group
whose op, bytes or dtype differ across its members at the same position, and Flight Recorder
entries of one (group, seq) that differ across ranks (its analyser's classes: type, size and
dtype mismatch). The stuck collectives' own mismatches are diag/metrics/failure_stuck.py's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from diag.metrics.failure_records import DESYNC_TAIL, RankRecords, Stuck, as_int
from diag.metrics.failure_stuck import mismatch_kind, signature
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
            kind = mismatch_kind(key, common)
            out.append({"class": f"{kind} mismatch", "group": label, "seq": seq,
                        "step": int(frame["step"].iloc[index]), "rank": member, "op": key[0],
                        "bytes": as_int(key[1]), "dtype": key[2],
                        "expected": {"op": common[0], "bytes": as_int(common[1]),
                                     "dtype": common[2]}})  # fmt: skip
    return out


def fr_desync(run: RunData) -> list[dict[str, Any]]:
    """Flight Recorder entries of one (group, seq) whose op, size or dtype differ across
    ranks (its analyser's classes: type, size and dtype mismatch). In columns: a 1,024-rank
    job's dumps hold 2M entries, of a few distinct signatures."""
    table = run.flight_recorder
    if table is None or table.empty:
        return []
    table = table[~table["p2p"].astype(bool)]
    if table.empty:
        return []
    # each entry's signature: its (op, sizes, dtype) factorised, each distinct one read once
    codes = [pd.factorize(table[c], use_na_sentinel=False) for c in ("op", "sizes", "dtype")]
    distinct, inverse = np.unique(
        np.stack([found for found, _ in codes], axis=1), axis=0, return_inverse=True
    )
    signatures: dict[tuple[Any, Any, Any], int] = {}
    values = [uniques for _, uniques in codes]
    of_distinct = np.array([
        signatures.setdefault(signature(*(v[i] for v, i in zip(values, row, strict=True))),
                              len(signatures))
        for row in distinct.tolist()
    ], dtype=np.int64)  # fmt: skip
    keys = list(signatures)
    frame = pd.DataFrame({"group": table["group"].to_numpy(dtype=object),
                          "seq": table["seq"].to_numpy(), "code": of_distinct[inverse.ravel()],
                          "rank": table["rank"].to_numpy()})  # fmt: skip
    by_entry = frame.groupby(["group", "seq"], sort=True)
    mixed = by_entry["code"].nunique()
    if not (mixed > 1).any():
        return []
    positions = by_entry.indices
    found: list[dict[str, Any]] = []
    usual: dict[Any, Counter[int]] = {}  # per group, how often each signature occurs
    for group, seq in mixed.index[mixed.to_numpy() > 1]:
        rows = frame.iloc[positions[(group, seq)]]
        at = rows["code"].tolist()
        if group not in usual:  # a tie goes to the group's usual signature
            usual[group] = Counter(frame["code"][frame["group"] == group].tolist())
        counts = usual[group]
        common = max(sorted(set(at), key=lambda c: str(keys[c])),
                     key=lambda c: (at.count(c), counts[c]))  # fmt: skip
        expected = keys[common]
        for rank, code in zip(rows["rank"].tolist(), at, strict=True):
            if code != common:
                key = keys[code]
                found.append({"class": f"{mismatch_kind(key, expected)} mismatch",
                              "group": str(group), "seq": int(seq), "step": None,
                              "rank": int(rank), "op": key[0], "sizes": key[1], "dtype": key[2],
                              "source": "flight recorder",
                              "expected": {"op": expected[0], "sizes": expected[1],
                                           "dtype": expected[2]}})  # fmt: skip
        if len(found) >= 64:
            break
    return found
