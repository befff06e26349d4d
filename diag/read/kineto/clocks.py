"""The host clocks of a trace folder, aligned from its collectives' ends.

Every rank's profiler writes its own host's clock. Hosts kept by NTP differ by a fraction of a
millisecond to several: as much as the waits the analysis reads, so who arrived last at a
collective, the skew and the replay would follow the clocks, not the job (a straggler costing
29 ms reads 10 ms when the second host's clock is 20 ms ahead, and is no longer first). Our
collectors align the ranks at a start barrier; a trace folder has none.

What every trace does have: no member of an all-reduce, all-gather or reduce-scatter finishes
before the last member has arrived and the data has gone round, and then all finish within
microseconds of each other. So the ends of one collective on its members are one moment, and
each rank's offset is the median, over the collectives it shares, of its end minus the
collective's median end (iterated, so that groups that do not span the world agree through the
ranks they share). Broadcasts, all-to-alls and point-to-point messages are not read: their
members finish at different moments by design. Nor are CPU-only (gloo) traces: their
collectives are host threads' events, whose ends wait for a core (a loaded host's rank ends
its all-reduces milliseconds late, every time, on one clock).

An offset is applied only when the data says it plainly: at least MIN_OFFSET_NS, at least
CONSISTENCY times the spread of that rank's ends around it (a loaded host's late thread gives a
noisy rank no offset), over at least MIN_MATCHED collectives. A rank whose offset is applied has
every time of its steps, spans and collectives moved by it, and a note says which and by how
much. Clocks that agree (one host, or hosts synchronised to the microseconds) are left alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from diag.read.run_data import RunData

ENDS_TOGETHER = ("all_reduce", "all_gather", "reduce_scatter")
"""The collectives whose members all finish at one moment."""
MIN_OFFSET_NS = 50_000
"""An offset below this is the noise of the ends themselves, not a clock."""
CONSISTENCY = 4.0
"""An offset must exceed this many times the median distance of the rank's ends from it."""
MIN_MATCHED = 5
"""Collectives shared with other ranks a rank needs for its offset to be read."""
ITERATIONS = 8
"""Rounds of re-estimation (a grid of groups converges in a few)."""


@dataclasses.dataclass(frozen=True)
class Offsets:
    """Per rank, the ns to subtract from its times (only ranks whose offset is applied)."""

    by_rank: dict[int, int]

    def note(self, folder: object) -> str:
        ms = sorted(self.by_rank.items())
        shown = ", ".join(f"rank {r} {-ns / 1e6:+.3g} ms" for r, ns in ms[:8])
        more = f" and {len(ms) - 8} more" if len(ms) > 8 else ""
        return (
            f"{folder}: host clocks aligned from the collectives' ends (members of an "
            f"all-reduce finish together): {shown}{more}"
        )


def offsets(run: RunData) -> Offsets:
    """The clock offsets the collectives' ends show (diag's groups name which ranks' records
    are one collective: the n-th of one op on one group instance per rank and step)."""
    comms = run.comms
    if comms.empty or comms["rank"].nunique() < 2 or run.manifest.layout_unknown:
        return Offsets({})
    if run.manifest.device_type != "cuda":  # a CPU trace's collectives are host threads'
        return Offsets({})
    kept = comms[comms["op"].isin(ENDS_TOGETHER)][["rank", "step", "op", "group", "t0", "t1"]]
    instance = _instances(kept, run.manifest.groups)
    if instance is None:
        return Offsets({})
    ranks = kept["rank"].to_numpy(dtype=np.int64)
    ends = kept["t1"].to_numpy(dtype=np.int64)
    shared = np.bincount(instance)[instance] >= 2
    ranks, ends, instance = ranks[shared], ends[shared], instance[shared]
    if len(ranks) == 0:
        return Offsets({})
    _, rank_index = np.unique(ranks, return_inverse=True)
    offset = np.zeros(rank_index.max() + 1)
    for _ in range(ITERATIONS):
        moved = ends - offset[rank_index]
        residual = moved - _medians(instance, moved)[instance]
        step = _medians(rank_index, residual)
        offset += step - np.median(offset + step) + np.median(offset)
        if np.abs(step).max() < 1_000:  # converged to a microsecond
            break
    offset -= _reference(offset)  # the clock most ranks keep stays as it is
    moved = ends - offset[rank_index]
    spread = _medians(rank_index, np.abs(moved - _medians(instance, moved)[instance]))
    matched = np.bincount(rank_index)
    plain = (
        (np.abs(offset) >= MIN_OFFSET_NS)
        & (np.abs(offset) >= CONSISTENCY * spread)
        & (matched >= MIN_MATCHED)
    )
    rank_of = np.unique(ranks)
    return Offsets({int(rank_of[i]): int(np.rint(offset[i])) for i in np.flatnonzero(plain)})


def aligned(run: RunData) -> RunData:
    """The run with every rank's times on one clock, and a note, where `offsets` finds any."""
    found = offsets(run)
    if not found.by_rank:
        return run
    return dataclasses.replace(
        run,
        steps=_shifted(run.steps, found.by_rank),
        spans=_shifted(run.spans, found.by_rank),
        comms=_shifted(run.comms, found.by_rank),
        skipped=[*run.skipped, found.note(run.path)],
    )


def _shifted(table: pd.DataFrame, by_rank: dict[int, int]) -> pd.DataFrame:
    if table.empty or "t0" not in table:
        return table
    shift = table["rank"].map(by_rank).fillna(0).to_numpy(dtype=np.int64)
    out = table.copy()
    for column in ("t0", "t1"):
        if column in out:
            out[column] = out[column].to_numpy(dtype=np.int64) - shift
    return out


def _instances(records: pd.DataFrame, groups: dict[str, list[list[int]]]) -> np.ndarray | None:
    """Per record, a dense id of the collective it is one member's part of: the n-th, by
    start, of its rank's records of one op in one step on one instance of its group (the
    manifest's groups say which ranks share it); None when no group is known."""
    if records.empty or not groups:
        return None
    group = records["group"].astype(object).to_numpy()
    rank = records["rank"].to_numpy(dtype=np.int64)
    which = np.full(len(records), -1, dtype=np.int64)
    for name, members in groups.items():  # per group name, rank -> its instance's index
        world = max((r for ranks in members for r in ranks), default=-1) + 1
        index = np.full(world, -1, dtype=np.int64)
        for i, ranks in enumerate(members):
            for r in ranks:
                if index[r] < 0:
                    index[r] = i
        mine = (group == name) & (rank >= 0) & (rank < world)
        which[mine] = index[rank[mine]]
    # arrays only: the frame's index is the records' positions 0..n-1
    frame = pd.DataFrame({
        "rank": rank, "step": records["step"].to_numpy(),
        "op": records["op"].astype(object).to_numpy(), "group": group, "which": which,
        "t0": records["t0"].to_numpy(),
    })  # fmt: skip
    frame = frame[which >= 0].sort_values("t0", kind="stable")
    if frame.empty:
        return None
    nth = frame.groupby(["rank", "step", "op", "group", "which"], sort=False).cumcount()
    keys = pd.MultiIndex.from_arrays(
        [frame["group"], frame["which"], frame["op"], frame["step"], nth.to_numpy()]
    )
    codes = np.full(len(records), -1, dtype=np.int64)
    codes[frame.index.to_numpy()] = pd.factorize(keys)[0]
    # records of no known group instance: an id of their own each, shared with nobody
    lone = codes < 0
    codes[lone] = codes.max() + 1 + np.arange(int(lone.sum()))
    return codes


def _reference(offset: np.ndarray) -> float:
    """The offset of the clock the most ranks keep: offsets sorted, a new clock where two
    neighbours differ by more than MIN_OFFSET_NS; of equal clocks, the lowest rank's. Theirs
    is left as written."""
    order = np.argsort(offset, kind="stable")
    clock = np.zeros(len(offset), dtype=np.int64)
    clock[order] = np.concatenate([[0], np.cumsum(np.diff(offset[order]) > MIN_OFFSET_NS)])
    counts = np.bincount(clock)
    lowest = np.array([np.flatnonzero(clock == c)[0] for c in range(len(counts))])
    best = max(range(len(counts)), key=lambda c: (counts[c], -lowest[c]))
    return float(np.median(offset[clock == best]))


def _medians(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The median of `values` per dense key (index = key)."""
    return pd.Series(values).groupby(keys).median().reindex(range(keys.max() + 1)).to_numpy()
