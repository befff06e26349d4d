"""Synchronisations nobody recorded, inferred from ranks resuming together.

A group whose collectives are not in the records (a profiler that missed a process group, a
job that traced only some of its calls) still synchronises its ranks: each waits, with nothing
recorded around the wait, until the slowest arrives, and then all of them go on at the same
moment. So where every member of a group resumes after time in no record within a small
tolerance of one moment, and at least one of them waited long enough to matter, the group met
in a collective there: each member arrived when its gap began and left when it ended. The
timeline (diag/whatif/timeline.py) adds these as blocking collectives of the group, and the
replay makes each such gap end when its slowest member arrives, as for a recorded one.

Every group of the manifest is searched, pipeline groups included, but only at gaps that end
at a record with no recorded dependency: a collective no other member recorded (a one-member
group's, one traced rank per tensor-parallel group), a span, a step's end. A gap that ends at
a recorded collective or message is read from that record (diag/whatif/timeline.py,
`_waiting_gaps`). A rank's gap joins one synchronisation only: the group's whose
synchronisations recur in the most steps (a job calls its collectives every step; ranks of
another group resuming together in one step is chance), among equals a clear one before an
ambiguous one and the narrowest group first (the last member to arrive is the one they waited
for).

Where the evidence is ambiguous the synchronisation is kept apart (`ambiguous`): the members'
gaps end apart by more than the tolerance, but every one of them resumes after the last
arrived and they resume at most CONTRACTION as far apart as they arrived. Ranks doing their own
unrecorded work resume as far apart as they began it (or further); ranks that waited for the
last resume together, a wake-up, or some work of their own after the wait, apart. Both fit
here: the attribution replays both readings and gives the costs as a range
(diag/whatif/attribution.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.numeric.ordering import lexicographic
from diag.whatif.matching import collective_instances, message_pair_rows

PIPELINE_AXIS = "pp"
"""The manifest's axis name of the pipeline groups (whose ranks exchange messages)."""

MIN_GAP_NS = 200_000
"""At least one member's gap is this long (shorter gaps are launches and Python between
calls: members resume together after those by chance)."""
RESUME_TOLERANCE_NS = 100_000
RESUME_TOLERANCE_SHARE = 0.02
"""Members resume together if their gaps end within the larger of these (ns, share of the
longest gap) of each other."""
CONTRACTION = 0.5
"""Members whose gaps end at most this share of their arrival spread apart (but beyond the
tolerance) may have waited for the last of them: the evidence is ambiguous."""
INFERRED_OP = schema.CollectiveOp.BARRIER.value
COLUMNS = ["rank", "step", "op", "group", "tag", "t0", "t1", "async", "ambiguous", "before"]
"""An inferred synchronisation's rows: a comm row of each member, whether the evidence for it
is ambiguous, and (ambiguous ones) what the member's gap ended at."""


def inferred_syncs(
    comms: pd.DataFrame, spans: pd.DataFrame, steps: pd.DataFrame, manifest: schema.Manifest
) -> pd.DataFrame:
    """Comm rows (COLUMNS) of the synchronisations inferred in the analysed records: one
    blocking `barrier` per member, from its gap's start to its end; `ambiguous` those that
    resumed too far apart to be sure (module docstring), with `before` what each member's gap
    ended at. Empty when none is found."""
    labels = {str(label) for label in comms["group"].dropna().unique()}
    # a group is recorded when its collectives are, under its name or another's of the
    # same members (`world` and `dp` of a pure data-parallel job)
    recorded = {
        frozenset(members) for label in labels for members in manifest.groups.get(label, [])
    }
    groups = sorted(((axis, [int(m) for m in members]) for axis, lists in manifest.groups.items()
                     for members in lists if len(members) >= 2),
                    key=lambda group: len(group[1]))  # fmt: skip
    if not groups:
        return _rows([])
    dependency = _with_dependency(comms, manifest)
    gaps = _gaps(comms, spans, steps, dependency)
    # where the group's collectives or messages are recorded, only a gap that ends at a
    # collective nobody else recorded can hide a synchronisation: their resuming together at
    # a span is what ranks leaving a recorded collective together and doing the same work do
    lone = _gaps(comms, spans, steps, dependency, lone_only=True)
    found: list[dict] = []
    used: dict[int, set[int]] = {}  # per rank, the ends of its gaps already in a sync
    searched = [axis == PIPELINE_AXIS or axis in labels or frozenset(members) in recorded
                for axis, members in groups]  # fmt: skip
    # which group's synchronisation a gap joins: that of the group found synchronising in
    # the most steps, clearly or not (the job calls its collectives every step; ranks of
    # another group resuming together in one step is chance), then a clear one before an
    # ambiguous one, then the narrowest group
    order = []
    for place, ((axis, members), lone_only) in enumerate(zip(groups, searched, strict=True)):
        found_in = [{row["step"] for row in _group_syncs(axis, members, lone if lone_only else
                                                         gaps, {}, loose=loose)}
                    for loose in (False, True)]  # fmt: skip
        recurring = len(found_in[0] | found_in[1])
        order += [(-recurring, loose, len(members), place, lone_only)
                  for loose in (False, True) if found_in[loose]]  # fmt: skip
    for _, loose, _, place, lone_only in sorted(order):
        axis, members = groups[place]
        rows = _group_syncs(axis, members, lone if lone_only else gaps, used, loose=loose)
        for row in rows:
            row["ambiguous"] = loose
        found += rows
    return _described(_rows(found), comms, spans, steps)


def _with_dependency(comms: pd.DataFrame, manifest: schema.Manifest) -> np.ndarray:
    """Per comm row, whether another rank recorded its other side: a member of a collective
    seen on two ranks or more, a matched send or receive."""
    out = collective_instances(comms, manifest) >= 0
    receives, sends = message_pair_rows(comms, manifest)
    out[receives] = True
    out[sends] = True
    return out


def _gaps(
    comms: pd.DataFrame,
    spans: pd.DataFrame,
    steps: pd.DataFrame,
    dependency: np.ndarray,
    lone_only: bool = False,
) -> dict[int, tuple]:
    """Per rank, its times in no record within and between its analysed steps that end at no
    record with a recorded dependency (`dependency`: per comm row); `lone_only`: only those
    that end at a collective no other rank recorded, and one of no length at such a
    collective where none ends there. (starts, ends, steps), by end. A step's
    start and end are records of no length."""
    columns = ["rank", "step", "t0", "t1"]
    parts = [comms[columns].assign(dep=dependency, lone=~dependency),
             spans[columns].assign(dep=False, lone=False)]  # fmt: skip
    marks = [*columns, "dep", "lone"]
    parts += [steps.assign(t1=steps["t0"], dep=False, lone=False)[marks],
              steps.assign(t0=steps["t1"], dep=False, lone=False)[marks]]  # fmt: skip
    records = pd.concat(parts, ignore_index=True)
    rank = records["rank"].to_numpy(dtype=np.int64)
    t0 = records["t0"].to_numpy(dtype=np.int64)
    t1 = records["t1"].to_numpy(dtype=np.int64)
    step = records["step"].to_numpy(dtype=np.int64)
    dep = records["dep"].to_numpy(dtype=bool)
    lone = records["lone"].to_numpy(dtype=bool)
    order = lexicographic(rank, t0)
    rank, t0, t1, step = rank[order], t0[order], t1[order], step[order]
    dep, lone = dep[order], lone[order]
    out: dict[int, tuple] = {}
    bounds = np.flatnonzero(np.diff(rank)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(rank)], strict=True):
        if hi - lo < 2:
            continue
        reach = np.maximum.accumulate(t1[lo:hi])  # covered until, after each record
        start, end = reach[:-1], t0[lo + 1 : hi]
        # ends at a record another rank saw the other side of (any record starting then)
        dependent_at = t0[lo:hi][dep[lo:hi]]
        open_ = (end > start) & ~np.isin(end, dependent_at)
        if lone_only:
            # and the rank that arrived last may have had no gap at all: its event ran into
            # the collective (a gap of no length there, at the collective's start)
            at_lone = np.isin(end, t0[lo:hi][lone[lo:hi]]) & ~np.isin(end, dependent_at)
            open_ = at_lone & (np.r_[end[1:] != end[:-1], True])  # once a moment
            start = np.minimum(start, end)
        out[int(rank[lo])] = (start[open_], end[open_], step[lo + 1 : hi][open_])
    return out


def _group_syncs(
    axis: str,
    members: list[int],
    gaps: dict[int, tuple],
    used: dict[int, set[int]],
    loose: bool = False,
) -> list[dict]:
    """The synchronisations of one group: moments at which every member's gap ends within
    the tolerance, one of those gaps at least MIN_GAP_NS long, the first member there at
    least that much (and the tolerance) before the last, none of them in a
    synchronisation found before (`used`: per rank, the ends of those gaps; updated).
    `loose`: those whose gaps, in one step, end within CONTRACTION of their arrival spread
    of each other instead (the ambiguous ones, module docstring)."""
    if any(m not in gaps or not len(gaps[m][1]) for m in members):
        return []
    candidates = np.unique(np.concatenate([gaps[m][1][gaps[m][1] - gaps[m][0] >= MIN_GAP_NS]
                                           for m in members]))  # fmt: skip
    if not len(candidates):
        return []
    matched = np.ones(len(candidates), dtype=bool)
    longest = np.zeros(len(candidates), dtype=np.int64)
    first_start = np.full(len(candidates), np.iinfo(np.int64).max, dtype=np.int64)
    last_start = np.full(len(candidates), np.iinfo(np.int64).min, dtype=np.int64)
    nearest: dict[int, np.ndarray] = {}
    for m in members:
        starts, ends, _ = gaps[m]
        j = np.clip(np.searchsorted(ends, candidates), 1, len(ends)) - 1
        after = np.minimum(j + 1, len(ends) - 1)
        j = np.where(np.abs(ends[after] - candidates) < np.abs(ends[j] - candidates), after, j)
        nearest[m] = j
        longest = np.maximum(longest, ends[j] - starts[j])
        first_start = np.minimum(first_start, starts[j])
        last_start = np.maximum(last_start, starts[j])
    tolerance = np.maximum(RESUME_TOLERANCE_NS, longest * RESUME_TOLERANCE_SHARE)
    # someone waited for the last to arrive: members that left a collective together and did
    # the same unrecorded work resume together too, having waited for nobody
    matched &= last_start - first_start >= np.maximum(MIN_GAP_NS, tolerance)
    for m in members:  # and nobody resumed before the last arrived
        matched &= gaps[m][1][nearest[m]] >= last_start - tolerance
    together = matched.copy()
    for m in members:
        together &= np.abs(gaps[m][1][nearest[m]] - candidates) <= tolerance
    if loose:
        # resumed closer together than they arrived, in one step; and not the gaps of a
        # clear synchronisation (another candidate of the cluster finds them together)
        ends = np.array([gaps[m][1][nearest[m]] for m in members])
        first_end, last_end = ends.min(axis=0), ends.max(axis=0)
        matched &= last_end - first_end <= CONTRACTION * (last_start - first_start)
        step_of = np.array([gaps[m][2][nearest[m]] for m in members])
        matched &= (step_of == step_of[0]).all(axis=0)
        keys = _gap_set_keys(nearest, members)
        matched &= ~np.isin(keys, keys[together])
        reach = last_end
    else:
        matched = together
        reach = candidates + tolerance
    syncs: list[dict] = []
    used_until = np.iinfo(np.int64).min
    for c in np.flatnonzero(matched):  # one synchronisation a cluster of candidates
        if candidates[c] <= used_until:
            continue
        if any(int(gaps[m][1][nearest[m][c]]) in used.get(m, ()) for m in members):
            continue
        used_until = int(reach[c])
        for m in members:
            used.setdefault(m, set()).add(int(gaps[m][1][nearest[m][c]]))
            starts, ends, steps = gaps[m]
            j = nearest[m][c]
            syncs.append({"rank": m, "step": int(steps[j]), "op": INFERRED_OP, "group": axis,
                          "tag": None, "t0": int(starts[j]), "t1": int(ends[j]),
                          "async": False})  # fmt: skip
    return syncs


def _gap_set_keys(nearest: dict[int, np.ndarray], members: list[int]) -> np.ndarray:
    """Per candidate, one number for the set of gaps it takes (each member's gap index): equal
    sets give equal keys; distinct sets a collision only by a chance of about 2**-64."""
    weights = np.random.default_rng(len(members)).integers(1, 2**63, size=len(members),
                                                          dtype=np.uint64)  # fmt: skip
    key = np.zeros(len(nearest[members[0]]), dtype=np.uint64)
    for m, weight in zip(members, weights, strict=True):
        key += nearest[m].astype(np.uint64) * weight  # wraps around: a hash, not a sum
    return key


def _rows(found: list[dict]) -> pd.DataFrame:
    rows = pd.DataFrame(found, columns=COLUMNS)
    rows["ambiguous"] = rows["ambiguous"].eq(True).astype(bool)  # missing: a clear one
    return rows


def _described(
    rows: pd.DataFrame, comms: pd.DataFrame, spans: pd.DataFrame, steps: pd.DataFrame
) -> pd.DataFrame:
    """`rows` with `before` filled for the ambiguous ones: what the rank's record at the gap's
    end was (`all_reduce (cp)`, `fwd`, `the step's end`), for the report to say where."""
    where = np.flatnonzero(rows["ambiguous"].to_numpy(dtype=bool))
    if not len(where):
        return rows
    named = [
        comms.assign(what=comms["op"].astype(str) + " (" + comms["group"].astype(str) + ")"),
        spans.assign(what=spans["phase"].astype(str)),
        steps.assign(t0=steps["t1"], what="the step's end"),
        steps.assign(what="the step's start"),
    ]
    records = pd.concat([n[["rank", "t0", "what"]] for n in named], ignore_index=True)
    first = records.drop_duplicates(["rank", "t0"])  # comms first: what the rank waited in
    keys = rows.iloc[where][["rank", "t1"]].rename(columns={"t1": "t0"})
    what = keys.merge(first, on=["rank", "t0"], how="left")["what"].fillna("no record")
    rows = rows.astype({"before": object})
    rows.iloc[where, rows.columns.get_loc("before")] = what.to_numpy(dtype=object)
    return rows
