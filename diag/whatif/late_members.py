"""Waiting, inside collectives the traced members share, for members nobody traced.

A trace folder often lacks some ranks' files (a node's traces lost, a rank that wrote none).
Where two or more members of a group were traced, their collectives are matched as usual
(diag/whatif/matching.py) and each member's time from the last *traced* arrival to its end
reads as transfer. But the collective ends only once every member has arrived: where an
untraced member came later, that part is waiting for it, and read as transfer it made a
late rank with no trace look like a slow network (a dp=8 job with its straggler's trace
removed read "communication not hidden, 32% of the step" and named nobody).

What bounds the transfer is size: a message is not carried faster than a larger one of the
same op among groups of the same axis (a fully traced group of that axis, or a collective of
the same group that waited for nobody). So each collective's transfer is at most the shortest
that any collective of the axis and op with at least its bytes took from its last traced
arrival to its end; the time beyond that bound (and beyond a slack for the transfer's own
variation) is waiting for the untraced members. It is a lower bound of their lateness, read
only where the sizes are recorded (GPU traces, run directories): without sizes a small
collective's time would bound a large one's, and nothing is inferred. The groups of an axis
are taken to have links alike (the same span of hosts), as a regular layout gives them.

Where no collective bounds them (one group of the axis, late in every collective alike) the
data cannot tell transfer from waiting: those collectives are flagged `unsure`, and what
their transfer is said to cost is a range whose low end reads them as waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.whatif.absent_members import ARRIVED_LAST_SLACK_NS, ARRIVED_LAST_SLACK_SHARE
from diag.whatif.timeline_model import Kind


@dataclass(frozen=True)
class LateMembers:
    """Per timeline event, the waiting for untraced members inside its transfer (`late_ns`,
    0 elsewhere) and which members (`code`: an index into `members`, -1 elsewhere)."""

    late_ns: np.ndarray
    code: np.ndarray
    members: list[tuple[int, ...]]
    unsure: np.ndarray
    """Per event: a collective of a group with untraced members whose transfer may be all
    waiting for them (no faster collective bounds it)."""


def untraced_in_groups(
    manifest: schema.Manifest, traced: set[int], at_least: int = 2
) -> dict[tuple[str, int], tuple[int, ...]]:
    """(group label, traced rank) -> the members of that rank's group nobody traced, for the
    groups (manifest.groups) with at least `at_least` traced members and some untraced: with
    two, the groups whose collectives are matched though incomplete (with one, its traced
    member stands in for the others: absent_members.py)."""
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    for axis, groups in manifest.groups.items():
        for members in groups:
            mine = traced.intersection(members)
            if len(mine) >= at_least and len(mine) < len(set(members)):
                missing = tuple(sorted(set(members) - traced))
                for rank in mine:
                    out[(str(axis), rank)] = missing
    return out


def late_members(
    events: pd.DataFrame,
    ops: np.ndarray,
    sizes: np.ndarray | None,
    manifest: schema.Manifest,
    traced: set[int],
) -> LateMembers:
    """The `LateMembers` of a timeline's `events` (kind, instance, group, rank, transfer_ns,
    source); `ops` and `sizes` (bytes, NaN unknown) per comms row (`source`)."""
    n = len(events)
    none = LateMembers(np.zeros(n), np.full(n, -1, dtype=np.int64), [], np.zeros(n, dtype=bool))
    missing = untraced_in_groups(manifest, traced)
    if not missing or n == 0:
        return none
    if sizes is None:
        sizes = np.full(int(events["source"].max()) + 1, np.nan)
    source = events["source"].to_numpy(dtype=np.int64)
    kind = events["kind"].to_numpy()
    rank = events["rank"].to_numpy(dtype=np.int64)
    group = events["group"].astype(str).to_numpy()
    matched = (events["instance"].to_numpy() >= 0) & np.isin(kind, [Kind.SYNC, Kind.LAUNCH])
    candidates = np.flatnonzero(matched & (source >= 0))
    size = np.asarray(sizes, dtype=np.float64)[source[candidates]]
    pairs = zip(group[candidates], rank[candidates], strict=True)
    keys = [missing.get((g, int(r))) for g, r in pairs]
    incomplete = np.array([k is not None for k in keys], dtype=bool)
    sized = np.isfinite(size) & (size > 0)
    # the reference: every sized matched collective of the axes with untraced members
    axes = {g for g, _ in missing}
    reference = sized & np.isin(group[candidates], list(axes))
    rows = candidates[reference]
    transfer = events["transfer_ns"].to_numpy(dtype=np.float64)[rows]
    table = pd.DataFrame({
        "group": group[rows], "op": np.asarray(ops, dtype=object)[source[rows]],
        "bytes": size[reference], "transfer": transfer,
    })  # fmt: skip
    bound = _transfer_bound(table)
    slack = np.maximum(ARRIVED_LAST_SLACK_NS, ARRIVED_LAST_SLACK_SHARE * bound)
    waited = np.where(transfer - bound > slack, transfer - bound, 0.0)
    late_ns = np.zeros(n)
    mine = incomplete[reference]
    late_ns[rows[mine]] = waited[mine]
    # unsure: the collectives of incomplete groups that no collective of a complete group
    # of the axis bounds (with at least their bytes): the bound itself may be waiting
    unsure = np.zeros(n, dtype=bool)
    unsure[candidates[incomplete & ~sized]] = True
    complete = table.assign(transfer=np.where(mine, np.inf, transfer))
    unsure[rows[mine]] = ~np.isfinite(_transfer_bound(complete)[mine])
    chosen = [k for k, ok in zip(keys, incomplete, strict=True) if ok and k is not None]
    # a rank standing in for untraced members of another group (its only traced member)
    # waited for the same members there: where they are members found late here, their
    # lateness is in its local time (`absent_ns`), and their being on time removes it too
    alone = untraced_in_groups(manifest, traced, at_least=1)
    standing = np.flatnonzero((events["stand_in"].to_numpy() > 0) & (source >= 0))
    theirs = [alone.get((g, int(r))) for g, r in zip(group[standing], rank[standing], strict=True)]
    late_sets = {k for k, w in zip(chosen, late_ns[candidates[incomplete]] > 0, strict=True) if w}
    found = [i for i, k in enumerate(theirs) if k in late_sets]
    members = sorted(set(chosen))
    index = {m: i for i, m in enumerate(members)}
    code = np.full(n, -1, dtype=np.int64)
    code[candidates[incomplete]] = [index[k] for k in chosen]
    code[standing[found]] = [index[theirs[i]] for i in found]  # type: ignore[index]
    return LateMembers(late_ns, code, members, unsure)


def _transfer_bound(table: pd.DataFrame) -> np.ndarray:
    """Per row (group, op, bytes, transfer), the shortest transfer of any row of its group
    label (axis) and op with at least its bytes."""
    if table.empty:
        return np.zeros(0)
    by_size = table.groupby(["group", "op", "bytes"], sort=True)["transfer"].min()
    # within each (axis, op), from the largest size down: the running minimum
    frame = by_size.reset_index().iloc[::-1]
    frame["bound"] = frame.groupby(["group", "op"], sort=False)["transfer"].cummin()
    bounds = frame.set_index(["group", "op", "bytes"])["bound"]
    keys = pd.MultiIndex.from_frame(table[["group", "op", "bytes"]])
    return bounds.reindex(keys).to_numpy(dtype=np.float64)
