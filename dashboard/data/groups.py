"""Groups of ranks: the ways a run's ranks can be grouped (host, pipeline stage, DP replica,
blocks), every rank's group, and the ranks of one group that a page draws."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboard.data.runs import LoadedRun
from diag.contract import schema

PER_RANK_MAX = 64
"""Up to this many ranks the pages draw every rank (bars, rows, table lines); above it they group
the ranks and draw one group's ranks at a time (the drill-down), at most this many of them."""
BLOCK_RANKS = 32
"""The ranks of one group when a run has no other grouping: ranks 0-31, 32-63, ..."""
GROUPINGS = {
    "none": "each rank",
    "host": "host",
    "stage": "pipeline stage",
    "replica": "DP replica",
    "block": f"blocks of {BLOCK_RANKS} ranks",
}
"""The ways to group ranks, by key, and what the selector calls them."""


def world_ranks(loaded: LoadedRun) -> np.ndarray:
    """Every rank of the run, sorted: the manifest's world and any rank with analysed time."""
    manifest = loaded.run.manifest
    known = [np.arange(manifest.world_size), np.asarray([r.rank for r in manifest.ranks], int)]
    if not loaded.metrics.ranks.empty:
        known.append(loaded.metrics.ranks["rank"].to_numpy(dtype=np.int64))
    return np.unique(np.concatenate(known)).astype(np.int64)


def dp_replicas(manifest: schema.Manifest, ranks: Sequence[int] | np.ndarray) -> pd.Series:
    """The DP replica of every rank in `ranks` (a Series indexed by rank): the ranks holding one
    copy of the model share a replica, the index of their position along the data-parallel axis.

    From `groups["dp"]` (docs/run-format.md): the i-th rank of every DP group, sorted, is in
    replica i (each DP group holds one rank per replica). Without DP groups the layout decides:
    `dp` <= 1 is one replica of the whole world, otherwise the world splits into `dp` blocks of
    consecutive ranks (dp is the outermost axis of the rank grid). Ranks in no DP group are
    replica 0."""
    index = pd.Index(np.asarray(ranks, dtype=np.int64), name="rank")
    dp_groups = [sorted(int(r) for r in group) for group in manifest.groups.get("dp") or []]
    if dp_groups:
        rank_of = np.concatenate([np.asarray(g, dtype=np.int64) for g in dp_groups])
        position = np.concatenate([np.arange(len(g), dtype=np.int64) for g in dp_groups])
        found = pd.Series(position, index=rank_of).groupby(level=0).first()
        return found.reindex(index, fill_value=0).astype(np.int64)
    dp = manifest.layout.dp or 1
    world = max(manifest.world_size, int(index.max()) + 1 if len(index) else 1)
    if dp <= 1 or world % dp != 0:
        return pd.Series(0, index=index, dtype=np.int64)
    return pd.Series(index.to_numpy() // (world // dp), index=index, dtype=np.int64)


_MEMO: OrderedDict[tuple[int, str], tuple[LoadedRun, Any]] = OrderedDict()
_MEMO_SIZE = 64
_MEMO_LOCK = threading.Lock()


def _memo(loaded: LoadedRun, key: str, compute: Callable[[], Any]) -> Any:
    """`compute()` once per run and key (the server's runs never change); the value is shared,
    so callers must not modify it. Held with its run, so a run's id is not reused meanwhile."""
    slot = (id(loaded), key)
    with _MEMO_LOCK:
        hit = _MEMO.get(slot)
        if hit is not None and hit[0] is loaded:
            _MEMO.move_to_end(slot)
            return hit[1]
    value = compute()
    with _MEMO_LOCK:
        _MEMO[slot] = (loaded, value)
        while len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return value


def rank_groups(loaded: LoadedRun, by: str) -> pd.DataFrame:
    """Every rank with its group's label under grouping `by` (a key of GROUPINGS; anything else
    is "none"): columns rank, group, order (the group's position: groups ordered by their first
    rank), sorted by order then rank. Computed once per run and grouping: do not modify it."""
    return _memo(loaded, f"groups:{by}", lambda: _rank_groups(loaded, by))


def _rank_groups(loaded: LoadedRun, by: str) -> pd.DataFrame:
    ranks = world_ranks(loaded)
    labels = _group_labels(loaded, by, ranks)
    frame = pd.DataFrame({"rank": ranks, "group": labels.astype(str)})
    first = frame.groupby("group", sort=False)["rank"].transform("min")
    frame["order"] = first.rank(method="dense").astype(np.int64) - 1
    return frame.sort_values(["order", "rank"], kind="stable").reset_index(drop=True)


def _group_labels(loaded: LoadedRun, by: str, ranks: np.ndarray) -> np.ndarray:
    index = pd.Index(ranks, name="rank")
    if by == "host":
        hosts = {r.rank: r.host for r in loaded.run.manifest.ranks if r.host}
        table = loaded.metrics.ranks
        if not table.empty and "host" in table:
            known = table.dropna(subset=["host"])
            hosts = {**dict(zip(known["rank"].astype(int), known["host"], strict=True)), **hosts}
        return pd.Series(hosts, dtype=object).reindex(index).fillna("unknown host").to_numpy()
    if by == "stage":
        table = loaded.metrics.ranks
        stages = (
            table.dropna(subset=["stage"]).set_index("rank")["stage"]
            if not table.empty and "stage" in table
            else pd.Series(dtype=object)
        )
        stage = stages.reindex(index)
        named = "stage " + stage.astype("Int64").astype(str)
        return named.where(stage.notna(), "no stage").to_numpy()
    if by == "replica":
        return ("replica " + dp_replicas(loaded.run.manifest, ranks).astype(str)).to_numpy()
    if by == "block":
        start = ranks // BLOCK_RANKS * BLOCK_RANKS
        stop = np.minimum(start + BLOCK_RANKS - 1, ranks.max(initial=0))
        return (
            "ranks " + pd.Series(start).astype(str) + "-" + pd.Series(stop).astype(str)
        ).to_numpy()
    return ("rank " + pd.Series(ranks).astype(str)).to_numpy()


def groupings(loaded: LoadedRun) -> list[str]:
    """The groupings that make sense for this run, the default first: "none" up to
    PER_RANK_MAX ranks; host, stage (pp > 1) and DP replica when they split the ranks into more
    than one group of more than one rank; blocks of consecutive ranks above PER_RANK_MAX."""
    return list(_memo(loaded, "groupings", lambda: tuple(_groupings(loaded))))


def _groupings(loaded: LoadedRun) -> list[str]:
    ranks = world_ranks(loaded)
    choices = ["none"] if len(ranks) <= PER_RANK_MAX else []
    for by in ("host", "stage", "replica"):
        if by == "stage" and (loaded.run.manifest.layout.pp or 1) <= 1:
            continue
        count = rank_groups(loaded, by)["group"].nunique()
        if 1 < count < len(ranks):
            choices.append(by)
    if len(ranks) > PER_RANK_MAX:
        choices.append("block")
    return choices


def pick_grouping(loaded: LoadedRun, by: Any) -> str:
    """`by` if it is one of this run's groupings (as the browser sent it), else the default."""
    choices = groupings(loaded)
    return by if isinstance(by, str) and by in choices else choices[0]


def pick_group(groups: pd.DataFrame, value: Any, blamed: Sequence[int] = ()) -> str:
    """The group named `value` if there is one, else the group of the first blamed rank, else
    the first group."""
    names = groups["group"]
    if isinstance(value, str) and (names == value).any():
        return value
    group_of = dict(zip(groups["rank"], names, strict=True))
    held = [group_of[r] for r in blamed if r in group_of]
    if held:
        return str(held[0])
    return str(names.iloc[0]) if len(names) else ""


def group_members(
    groups: pd.DataFrame, group: str, blamed: Sequence[int] = (), limit: int = PER_RANK_MAX
) -> tuple[list[int], int]:
    """The ranks of `group` to draw, in rank order, and how many ranks the group has. A group of
    more than `limit` ranks is cut to `limit`: its blamed ranks first, then the lowest."""
    ranks = groups.loc[groups["group"] == group, "rank"].to_numpy(dtype=np.int64)
    if len(ranks) <= limit:
        return sorted(int(r) for r in ranks), len(ranks)
    is_blamed = np.isin(ranks, np.asarray(list(blamed), dtype=np.int64))
    kept = np.concatenate([ranks[is_blamed], ranks[~is_blamed]])[:limit]
    return sorted(int(r) for r in kept), len(ranks)
