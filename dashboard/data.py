"""The runs a dashboard serves, loaded once at start-up, and the per-step tables its pages plot.

The browser names a run by its position in the list the server was started with, never by a
path: no request reaches a file the user did not name on the command line.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag import RunData, RunMetrics, diagnose, load_any, schema

NS_PER_MS = 1e6


@dataclass(frozen=True)
class LoadedRun:
    name: str  # unique label in the run selector
    run: RunData
    metrics: RunMetrics
    report: dict[str, Any]  # the diag.report/1 JSON contract

    @property
    def blamed_ranks(self) -> list[int]:
        """Ranks named by a finding, of any severity, first finding first (findings come
        ordered by severity, then cost). A low finding's ranks count too: severity grades what
        the finding costs the step, and the ranks it names are still the ones the diagnosis
        points at (a straggler costs little where communication dominates the step)."""
        ranks: list[int] = []
        for finding in self.report["findings"]:
            ranks += [r for r in finding.get("ranks") or [] if r not in ranks]
        return ranks

    @property
    def peak_bytes(self) -> float | None:
        """The highest rank peak (`RunMetrics.memory_peak`); None without a measured byte."""
        peaks = self.metrics.memory_peak
        top = peaks["peak_bytes"].max() if not peaks.empty else None
        return float(top) if top is not None and pd.notna(top) and top > 0 else None

    @property
    def budget_bytes(self) -> float | None:
        declared = self.run.manifest.hardware.device_memory_bytes
        return float(declared) if declared else None


def load_runs(
    paths: Sequence[str | Path], config: dict[str, Any] | None = None, hta: bool = False
) -> list[LoadedRun]:
    """Load, measure and diagnose every run (`hta`: with HTA's analyses of its traces);
    raises `diag.errors.InputError` on unusable input."""
    loaded: list[LoadedRun] = []
    taken: set[str] = set()
    for path in paths:
        run = load_any(path)
        metrics, report = diagnose(run, config, hta)
        name = _unique(run.manifest.run_id or Path(path).name, taken)
        loaded.append(LoadedRun(name, run, metrics, report))
    return loaded


def _unique(name: str, taken: set[str]) -> str:
    label, n = name, 2
    while label in taken:
        label, n = f"{name} ({n})", n + 1
    taken.add(label)
    return label


def pick(runs: Sequence[LoadedRun], index: Any) -> LoadedRun:
    """The run at `index` as the browser sent it; anything else (a string, out of range) is the
    first run."""
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(runs):
        return runs[index]
    return runs[0]


# --- Tables for the pages -----------------------------------------------------------------------


def analysed_steps(loaded: LoadedRun) -> list[int]:
    steps = loaded.metrics.rank_steps["step"]
    return sorted(int(s) for s in steps.unique()) if not steps.empty else []


def timeline_steps(loaded: LoadedRun) -> list[int]:
    """The analysed steps whose spans the run holds: all of them, or those below
    `RunData.span_steps` for a run too large to keep every span."""
    limit = loaded.run.span_steps
    steps = analysed_steps(loaded)
    return steps if limit is None else [s for s in steps if s < limit]


@dataclass(frozen=True)
class Window:
    """The spans and collectives of some steps, start and duration in ms from the first span."""

    spans: pd.DataFrame
    comms: pd.DataFrame


def timeline_window(
    run: RunData, steps: Sequence[int], ranks: Sequence[int] | None = None
) -> Window:
    """The spans and collectives of `steps` (of `ranks` only, when given), on a clock that starts
    at the first span of those steps on any rank (so two groups' windows share it)."""
    spans = run.spans[run.spans["step"].isin(list(steps))]
    comms = run.comms[run.comms["step"].isin(list(steps))]
    origin_ns = int(spans["t0"].min()) if not spans.empty else 0
    if ranks is not None:
        spans = spans[spans["rank"].isin(list(ranks))]
        comms = comms[comms["rank"].isin(list(ranks))]
    return Window(_in_ms(spans, origin_ns), _in_ms(comms, origin_ns))


def _in_ms(records: pd.DataFrame, origin_ns: int) -> pd.DataFrame:
    return records.assign(
        start_ms=(records["t0"] - origin_ns) / NS_PER_MS,
        duration_ms=(records["t1"] - records["t0"]) / NS_PER_MS,
    ).sort_values(["rank", "t0"])


def comm_share_by_step(rank_steps: pd.DataFrame) -> pd.DataFrame:
    """Per step: the median and maximum over ranks of comm and exposed-comm share of the wall."""
    if rank_steps.empty:
        return pd.DataFrame(columns=["step", "comm_median", "comm_max", "exposed_median"])
    shares = rank_steps.assign(
        comm=rank_steps["comm_s"] / rank_steps["wall_s"],
        exposed=rank_steps["exposed_comm_s"] / rank_steps["wall_s"],
    )
    by_step = shares.groupby("step")
    return pd.DataFrame({
        "comm_median": by_step["comm"].median(),
        "comm_max": by_step["comm"].max(),
        "exposed_median": by_step["exposed"].median(),
    }).reset_index()  # fmt: skip


def memory_of_rank(memory_steps: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One rank's six categories per step (bytes), the last record of each step."""
    frame = memory_steps[memory_steps["rank"] == rank]
    columns = ["step", *schema.MEMORY_CATEGORIES]
    return frame[columns].groupby("step").last().reset_index()


def peak_rank(memory_peak: pd.DataFrame) -> int | None:
    """The rank with the highest peak (`RunMetrics.memory_peak`), the lowest on a tie; None
    when no rank measured a byte."""
    if memory_peak.empty or not (memory_peak["peak_bytes"] > 0).any():
        return None
    ordered = memory_peak.sort_values("rank", kind="stable").reset_index(drop=True)
    return int(ordered.loc[ordered["peak_bytes"].astype("float64").idxmax(), "rank"])


def memory_at_peak(memory_peak: pd.DataFrame, memory_steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the six categories of the record that holds its peak (`memory_peak`: rank,
    step, peak_bytes), so that a rank's stacked categories add up to its peak: rank, step,
    peak_bytes and the categories, by rank."""
    columns = ["rank", "step", "peak_bytes", *schema.MEMORY_CATEGORIES]
    if memory_peak.empty:
        return pd.DataFrame(columns=columns)
    cats = list(schema.MEMORY_CATEGORIES)
    records = memory_steps[["rank", "step", *cats]].merge(memory_peak, on=["rank", "step"])
    held = records[cats].astype("float64").fillna(0.0).sum(axis=1)
    records = records.loc[held.groupby([records["rank"], records["step"]]).idxmax()]
    return records[columns].sort_values("rank").reset_index(drop=True)


@dataclass(frozen=True)
class ExpertSteps:
    layer: int
    steps: list[int]
    tokens: np.ndarray  # (steps, experts): tokens routed to each expert, summed over ranks
    drop_rate: list[float | None]  # per step: dropped / routed


def expert_steps(experts: pd.DataFrame) -> list[ExpertSteps]:
    """Per MoE layer, the load of every expert at every step, and the drop rate per step."""
    layers: list[ExpertSteps] = []
    for layer, frame in experts.groupby("layer", sort=True):
        lengths = frame["tokens"].map(len).to_numpy()
        width = int(lengths.max(initial=0))
        if width == 0:
            continue
        steps = sorted(int(s) for s in frame["step"].unique())
        rows = pd.Index(steps).get_indexer(frame["step"])
        if (lengths == width).all():  # every record names every expert: one array at once
            loads = np.array([list(t) for t in frame["tokens"]], dtype=float)
        else:
            loads = np.zeros((len(frame), width))
            for i, load in enumerate(frame["tokens"]):
                loads[i, : len(load)] = load
        tokens = np.zeros((len(steps), width))
        np.add.at(tokens, rows, loads)
        drops = pd.to_numeric(frame["dropped"], errors="coerce").to_numpy(dtype=float)
        known = np.bincount(rows, weights=~np.isnan(drops), minlength=len(steps)) > 0
        dropped = np.bincount(rows, weights=np.nan_to_num(drops), minlength=len(steps))
        routed = tokens.sum(axis=1)
        rates = [
            float(d / r) if ok and r > 0 else None
            for d, r, ok in zip(dropped, routed, known, strict=True)
        ]
        layers.append(ExpertSteps(int(layer), steps, tokens, rates))
    return layers


# --- Rank groups --------------------------------------------------------------------------------

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


# --- Per-group statistics -----------------------------------------------------------------------

RANK_METRICS = {
    "busy": ("busy_s", "busy"),
    "exposed": ("exposed_comm_s", "exposed comm"),
    "idle": ("idle_s", "idle"),
    "wall": ("wall_s", "step wall"),
}
"""The per-rank times a heatmap or group chart can show, by key: (column, name)."""
WAIT_METRICS = {
    "skew": ("skew_s", "arrival skew"),
    "transfer": ("transfer_s", "transfer"),
}
"""The waiting a heatmap or group chart can show when the run has an attribution, by key:
(column, name). A rank's waiting in collectives split by the what-if replay
(`RunMetrics.attribution.waits`) into arrival skew (until its group's last member arrived) and
transfer; per rank and communication group, per step over the replayed steps: there is no value
per step, so their heatmap has a column per communication group."""


def rank_metrics(loaded: LoadedRun) -> dict[str, tuple[str, str]]:
    """The metrics the Ranks page offers for this run: RANK_METRICS, and WAIT_METRICS when the
    run has an attribution."""
    ranks = loaded.metrics.ranks
    waits = loaded.metrics.attribution is not None and "skew_s" in ranks
    return {**RANK_METRICS, **(WAIT_METRICS if waits else {})}


@dataclass(frozen=True)
class StepGrid:
    """A value per row (a group, or a rank) and step: the maximum over the row's ranks, the
    median, and the rank that holds the maximum (-1 where the row has no value)."""

    rows: list[str]
    steps: list[Any]  # the columns: steps (int), or communication groups (str) for WAIT_METRICS
    maximum: np.ndarray  # (rows, steps), NaN where no rank of the row has a value
    median: np.ndarray  # (rows, steps)
    top_rank: np.ndarray  # (rows, steps), int64


def step_grid(values: pd.DataFrame, groups: pd.DataFrame, by: str = "step") -> StepGrid:
    """`values` (rank, `by`, value) per row of `groups` (rank_groups) and value of `by`: a
    step, or with `by="comm_group"` a communication group (wait_values)."""
    merged = values.merge(groups, on="rank", how="inner").dropna(subset=["value"])
    rows = groups.drop_duplicates("order")["group"].tolist()
    steps = sorted(merged[by].unique().tolist())
    shape = (len(rows), len(steps))
    if merged.empty:
        empty = np.full(shape, np.nan)
        return StepGrid(rows, steps, empty, empty.copy(), np.full(shape, -1, dtype=np.int64))
    column = pd.Index(steps).get_indexer(merged[by])
    merged = merged.assign(col=column)
    median = merged.groupby(["order", "col"])["value"].median()
    top = merged.sort_values(["value", "rank"], ascending=[False, True], kind="stable")
    top = top.drop_duplicates(["order", "col"])
    grid_max, grid_median = np.full(shape, np.nan), np.full(shape, np.nan)
    grid_rank = np.full(shape, -1, dtype=np.int64)
    order, col = top["order"].to_numpy(), top["col"].to_numpy()
    grid_max[order, col] = top["value"].to_numpy(dtype=float)
    grid_rank[order, col] = top["rank"].to_numpy(dtype=np.int64)
    at = median.index
    grid_median[at.get_level_values(0), at.get_level_values(1)] = median.to_numpy(dtype=float)
    return StepGrid(rows, steps, grid_max, grid_median, grid_rank)


def group_stats(
    values: pd.DataFrame, groups: pd.DataFrame, blamed: Sequence[int] = ()
) -> pd.DataFrame:
    """Per group of `groups`, over its ranks' `values` (rank, value): ranks (how many have a
    value), median, maximum, max_rank (the rank holding it, the lowest on a tie) and blamed
    (whether a blamed rank is in the group), in group order."""
    merged = values.merge(groups, on="rank", how="inner").dropna(subset=["value"])
    top = merged.sort_values(["value", "rank"], ascending=[False, True], kind="stable")
    top = top.drop_duplicates("order").set_index("order")
    by_group = merged.groupby("order")
    named = groups.drop_duplicates("order").set_index("order")["group"]
    stats = pd.DataFrame({
        "group": named,
        "ranks": by_group.size(),
        "median": by_group["value"].median(),
        "maximum": top["value"],
        "max_rank": top["rank"],
        "blamed": groups.assign(b=groups["rank"].isin(list(blamed))).groupby("order")["b"].any(),
    }).dropna(subset=["maximum"])  # fmt: skip
    return stats.astype({"ranks": np.int64, "max_rank": np.int64}).reset_index(drop=True)


def rank_step_values(rank_steps: pd.DataFrame, metric: str) -> pd.DataFrame:
    """rank, step and value: a RANK_METRICS time of every rank at every step, in ms."""
    column = RANK_METRICS.get(metric, RANK_METRICS["busy"])[0]
    return pd.DataFrame({
        "rank": rank_steps["rank"], "step": rank_steps["step"],
        "value": 1e3 * rank_steps[column].astype(float),
    })  # fmt: skip


def rank_values(ranks: pd.DataFrame, metric: str) -> pd.DataFrame:
    """rank and value: a RANK_METRICS time of every rank per analysed step, or a WAIT_METRICS
    time per replayed step (over all its communication groups), in ms."""
    if metric in WAIT_METRICS:  # already per step
        per_step = 1e3 * pd.to_numeric(ranks[WAIT_METRICS[metric][0]], errors="coerce")
    else:
        column = RANK_METRICS.get(metric, RANK_METRICS["busy"])[0]
        per_step = 1e3 * ranks[column].astype(float) / ranks["steps"].clip(lower=1)
    return pd.DataFrame({"rank": ranks["rank"], "value": per_step})


def wait_values(waits: pd.DataFrame, metric: str) -> pd.DataFrame:
    """rank, comm_group and value: a WAIT_METRICS time of every rank in every communication
    group (`Attribution.waits`), ms per replayed step; for `step_grid(..., by="comm_group")`."""
    column = WAIT_METRICS.get(metric, WAIT_METRICS["skew"])[0]
    return pd.DataFrame({
        "rank": waits["rank"].astype(np.int64), "comm_group": waits["group"].astype(str),
        "value": 1e3 * pd.to_numeric(waits[column], errors="coerce"),
    })  # fmt: skip


def memory_totals(memory_steps: pd.DataFrame) -> pd.DataFrame:
    """rank, step and value: the sum of the measured memory categories of every rank at every
    step (bytes), the last record of each step; a category a step did not sample (activations
    are sampled every few steps) keeps the rank's last sampled value."""
    if memory_steps.empty:
        return pd.DataFrame(columns=["rank", "step", "value"])
    columns = list(schema.MEMORY_CATEGORIES)
    last = memory_steps.groupby(["rank", "step"], sort=True)[columns].last()
    filled = last.groupby(level="rank").ffill()
    total = filled.sum(axis=1, min_count=1)
    return total.rename("value").reset_index()


def memory_peaks(memory_peak: pd.DataFrame) -> pd.DataFrame:
    """rank and value: every rank's peak (`RunMetrics.memory_peak`, bytes)."""
    return pd.DataFrame({"rank": memory_peak["rank"], "value": memory_peak["peak_bytes"]})
