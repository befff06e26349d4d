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
ranks they share). Broadcasts and all-to-alls are not read: their members finish at
different moments by design. Hosts that share none of these collectives (a pipeline whose
stages are whole hosts) are linked through their messages instead, a send's and its
receive's kernels ending together (message_clocks.py), chained from the clock most ranks
keep. Nor are CPU-only (gloo) traces read: their collectives are host threads' events, whose
ends wait for a core (a loaded host's rank ends its all-reduces milliseconds late, every
time, on one clock).

An offset is applied only when the data says it plainly: at least MIN_OFFSET_NS, at least
CONSISTENCY times the spread of that rank's ends around it (a loaded host's late thread gives a
noisy rank no offset; a rank read through messages adds the links' spreads on the way), over
at least MIN_MATCHED collectives (and messages on each link). A rank whose offset is applied
has every time of its steps, spans and collectives moved by it, and a note says which and by how
much. Clocks that agree (one host, or hosts synchronised to the microseconds) are left alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from diag.read.kineto import message_clocks
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
    """Per rank, the ns to subtract from its times (only ranks whose offset is applied); of
    those, the ranks whose clock was read through messages (message_clocks.py); and the ranks
    whose clock nothing links to the reference clock though they send or receive."""

    by_rank: dict[int, int]
    through_messages: frozenset[int] = frozenset()
    unchecked: tuple[int, ...] = ()

    def note(self, folder: object) -> str:
        ms = sorted(self.by_rank.items())
        shown = ", ".join(f"rank {r} {-ns / 1e6:+.3g} ms" for r, ns in ms[:8])
        more = f" and {len(ms) - 8} more" if len(ms) > 8 else ""
        how = "the collectives' ends (members of an all-reduce finish together)"
        if self.through_messages & set(self.by_rank):
            linked = _ranks(sorted(self.through_messages & set(self.by_rank)))
            how += (
                f" and, for {linked}, which share none with the reference clock's, the "
                "messages' ends (a send's and its receive's kernels end together)"
            )
        return f"{folder}: host clocks aligned from {how}: {shown}{more}"

    def unchecked_note(self, folder: object) -> str:
        return (
            f"{folder}: the host clocks of {_ranks(list(self.unchecked))} are not checked "
            "against the others': they share no all-reduce-like collective with them, and too "
            "few of their sends and receives pair with a peer's in kernels that end together "
            "(no peer named, or batched with another peer's messages)"
        )


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}" + (
        f" and {len(ranks) - 8} more" if len(ranks) > 8 else ""
    )


@dataclasses.dataclass(frozen=True)
class _Estimate:
    """The collectives' reading, per rank (`ranks`, ascending): its offset (ns, in the frame
    of its set), the median distance of its ends from the collectives' (`spread`), how many
    collectives it shares (`matched`), and which set of ranks its collectives link it to
    (`clock`: ranks linked by shared collectives, directly or through others)."""

    ranks: np.ndarray
    offset: np.ndarray
    spread: np.ndarray
    matched: np.ndarray
    clock: np.ndarray


def offsets(run: RunData) -> Offsets:
    """The clock offsets the collectives' ends show (diag's groups name which ranks' records
    are one collective: the n-th of one op on one group instance per rank and step), and where
    they leave ranks on clocks of their own, the messages' ends between those."""
    comms = run.comms
    if comms.empty or comms["rank"].nunique() < 2 or run.manifest.layout_unknown:
        return Offsets({})
    if run.manifest.device_type == "cpu":  # a CPU trace's collectives are host threads'
        return Offsets({})
    found = _from_collectives(comms, run.manifest.groups)
    messages = comms["op"].isin(message_clocks.P2P).to_numpy()
    if messages.any():
        p2p_ranks = np.unique(comms["rank"].to_numpy(dtype=np.int64)[messages])
        known = found.ranks if found is not None else np.zeros(0, dtype=np.int64)
        alone = np.setdiff1d(p2p_ranks, known)
        sets = 0 if found is None else len(np.unique(found.clock))
        if sets + len(alone) > 1:  # clocks no collective links: the messages may
            return _with_messages(comms, found, alone)
    if found is None:
        return Offsets({})
    offset = found.offset - _reference(found.offset)  # the clock most ranks keep stays
    plain = (
        (np.abs(offset) >= MIN_OFFSET_NS)
        & (np.abs(offset) >= CONSISTENCY * found.spread)
        & (found.matched >= MIN_MATCHED)
    )
    return Offsets({int(found.ranks[i]): int(np.rint(offset[i])) for i in np.flatnonzero(plain)})


def _from_collectives(comms: pd.DataFrame, groups: dict[str, list[list[int]]]) -> _Estimate | None:
    """Each rank's offset from the ends of the collectives it shares (None: none shared)."""
    kept = comms[comms["op"].isin(ENDS_TOGETHER)][["rank", "step", "op", "group", "t0", "t1"]]
    instance = _instances(kept, groups)
    if instance is None:
        return None
    ranks = kept["rank"].to_numpy(dtype=np.int64)
    ends = kept["t1"].to_numpy(dtype=np.int64)
    shared = np.bincount(instance)[instance] >= 2
    ranks, ends, instance = ranks[shared], ends[shared], instance[shared]
    if len(ranks) == 0:
        return None
    rank_of, rank_index = np.unique(ranks, return_inverse=True)
    offset = np.zeros(rank_index.max() + 1)
    for _ in range(ITERATIONS):
        moved = ends - offset[rank_index]
        residual = moved - _medians(instance, moved)[instance]
        step = _medians(rank_index, residual)
        offset += step - np.median(offset + step) + np.median(offset)
        if np.abs(step).max() < 1_000:  # converged to a microsecond
            break
    moved = ends - offset[rank_index]
    spread = _medians(rank_index, np.abs(moved - _medians(instance, moved)[instance]))
    matched = np.bincount(rank_index)
    clock = _linked(rank_index, np.unique(instance, return_inverse=True)[1])
    return _Estimate(rank_of, offset, spread, matched, clock)


def _with_messages(comms: pd.DataFrame, found: _Estimate | None, alone: np.ndarray) -> Offsets:
    """The offsets where the collectives leave several sets of ranks (`found`'s, and `alone`:
    ranks that send or receive but share no collective): each set's clock from the messages
    between sets, chained from the set holding the clock most ranks keep (message_clocks.py).
    A set no link reaches is read as before, its clock taken as the one most of its ranks
    keep (right where each set spans the hosts, as data-parallel groups across them do); its
    ranks are named in a note where they sent or received messages that name a peer but
    could not be used. A rank is moved where its offset is plain against its own spread and
    the links' on the way."""
    if found is None:
        none = np.zeros(0)
        found = _Estimate(np.zeros(0, dtype=np.int64), none, none, none, np.zeros(0, np.int64))
    first_alone = int(found.clock.max()) + 1 if len(found.clock) else 0
    ranks = np.concatenate([found.ranks, alone])
    clock = np.concatenate([found.clock, first_alone + np.arange(len(alone))])
    offset = np.concatenate([found.offset, np.zeros(len(alone))])
    spread = np.concatenate([found.spread, np.zeros(len(alone))])
    # a rank alone has only its messages: the links' counts stand for its own
    matched = np.concatenate([found.matched, np.full(len(alone), MIN_MATCHED)])
    pairs = message_clocks.message_pairs(comms)
    linked = message_clocks.links(pairs, ranks, clock, offset)
    sizes = np.bincount(clock)
    # the ranks whose offsets are read: a rank alone only where a link reaches it
    collectives = np.arange(len(ranks)) < len(found.ranks)
    through, reach = _chain(linked, int(np.argmax(sizes)), clock)
    # chained again from the set that keeps most of the reference clock: the uncertainty of a
    # set's offset is that of the links between it and the reference
    read = reach | collectives
    on_reference = _on_reference((offset + through[:, 0])[read])
    root = int(np.argmax(np.bincount(clock[read][on_reference], minlength=len(sizes))))
    through, reach = _chain(linked, root, clock)
    read = reach | collectives
    total = offset + through[:, 0]
    total -= _reference(total[read])
    plain = (
        read
        & (np.abs(total) >= MIN_OFFSET_NS)
        & (np.abs(total) >= CONSISTENCY * (spread + through[:, 1]))
        & (matched >= MIN_MATCHED)
    )
    unused = np.isin(ranks, sorted(pairs.unused_ranks))
    return Offsets(
        by_rank={int(ranks[i]): int(np.rint(total[i])) for i in np.flatnonzero(plain)},
        through_messages=frozenset(ranks[plain & reach & (clock != root)].tolist()),
        unchecked=tuple(sorted(ranks[~reach & unused].tolist())),
    )


def _chain(
    linked: dict[tuple[int, int], message_clocks.Link], root: int, clock: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per rank (its set `clock`), its set's offset from the root set's clock and that offset's
    uncertainty (n x 2; 0 where no link reaches it), and whether a link reaches it."""
    chain = message_clocks.chained(linked, root, MIN_MATCHED)
    reach = np.array([c in chain for c in clock.tolist()], dtype=bool)
    through = np.array([chain.get(c, (0.0, 0.0)) for c in clock.tolist()], dtype=np.float64)
    return through.reshape(-1, 2), reach


def aligned(run: RunData) -> RunData:
    """The run with every rank's times on one clock, and a note, where `offsets` finds any."""
    found = offsets(run)
    notes = [found.unchecked_note(run.path)] if found.unchecked else []
    if not found.by_rank:
        return dataclasses.replace(run, skipped=[*run.skipped, *notes]) if notes else run
    return dataclasses.replace(
        run,
        steps=_shifted(run.steps, found.by_rank),
        spans=_shifted(run.spans, found.by_rank),
        comms=_shifted(run.comms, found.by_rank),
        skipped=[*run.skipped, found.note(run.path), *notes],
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
    """The offset of the clock the most ranks keep; theirs is left as written."""
    return float(np.median(offset[_on_reference(offset)]))


def _on_reference(offset: np.ndarray) -> np.ndarray:
    """Which offsets are on the clock the most ranks keep: offsets sorted, a new clock where
    two neighbours differ by more than MIN_OFFSET_NS; of equal clocks, the lowest rank's."""
    order = np.argsort(offset, kind="stable")
    clock = np.zeros(len(offset), dtype=np.int64)
    clock[order] = np.concatenate([[0], np.cumsum(np.diff(offset[order]) > MIN_OFFSET_NS)])
    counts = np.bincount(clock)
    lowest = np.array([np.flatnonzero(clock == c)[0] for c in range(len(counts))])
    best = max(range(len(counts)), key=lambda c: (counts[c], -lowest[c]))
    return clock == best


def _linked(rank_index: np.ndarray, instance: np.ndarray) -> np.ndarray:
    """Per rank (dense index), the id of its set: ranks that share a collective, directly or
    through others (labels spread through the collectives until they settle: at most as
    many rounds as ranks, a few in practice, with each label jumping to its label's)."""
    ranks = int(rank_index.max()) + 1
    label = np.arange(ranks)
    for _ in range(ranks):
        lowest = np.full(int(instance.max()) + 1, ranks, dtype=np.int64)
        np.minimum.at(lowest, instance, label[rank_index])
        new = label.copy()
        np.minimum.at(new, rank_index, lowest[instance])
        new = new[new]
        if (new == label).all():
            break
        label = new
    return np.unique(label, return_inverse=True)[1]


def _medians(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The median of `values` per dense key (index = key)."""
    return pd.Series(values).groupby(keys).median().reindex(range(keys.max() + 1)).to_numpy()
