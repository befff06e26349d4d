"""The time breakdown: per (rank, step), wall, busy, communication in flight, exposed
communication, idle and stage work, from the spans and blocking collectives inside each step's
window; and its per-rank totals (docs/metrics.md, "Time")."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.metrics.common import NS_PER_S
from diag.numeric.intervals import union_lengths_in_windows

PIPELINE_GROUP = "pp"
P2P_OPS = frozenset({schema.CollectiveOp.SEND.value, schema.CollectiveOp.RECV.value})
"""A send or receive of no named group is a pipeline's message: what sends and receives
carry between stages (a GPU trace's batched SendRecv kernels have no group arguments)."""


IN_FLIGHT, EXPOSED, EITHER, STAGE_WORK = (1 << k for k in range(4))
"""The unions measured per (rank, step), one bit each: collectives in flight; exposed
communication (waits: comm_wait spans and blocking collectives); compute or a wait; stage
work (compute and the rank's own waits, not its waits for pipeline neighbours)."""
MEASURES = ("comm", "exposed", "either", "stage_work")
"""The measures' names, in bit order."""


def _window_rows(
    ranks: np.ndarray, steps: np.ndarray, window_ranks: np.ndarray, window_steps: np.ndarray
) -> np.ndarray:
    """Each record's window: the row of the first window with the record's (rank, step), -1
    where none has it; one integer key per pair, looked up in a table over the key space
    when that is small (ranks and steps are dense), else by a binary search."""
    if not len(ranks) or not len(window_ranks):
        return np.full(len(ranks), -1, dtype=np.int64)
    low_rank, low_step = int(window_ranks.min()), int(window_steps.min())
    width = int(window_steps.max()) - low_step + 1
    space = (int(window_ranks.max()) - low_rank + 1) * width
    inside = (ranks >= low_rank) & (steps >= low_step) & (steps < low_step + width)
    keys = np.where(inside, (ranks - low_rank) * width + (steps - low_step), space)
    window_keys = (window_ranks - low_rank) * width + (window_steps - low_step)
    if space <= 4 * (len(ranks) + len(window_keys)) + 1024:
        row_of_key = np.full(space + 1, -1, dtype=np.int64)  # the last: no window
        row_of_key[window_keys[::-1]] = np.arange(len(window_keys))[::-1]  # the first wins
        return row_of_key[np.minimum(keys, space)]
    order = np.argsort(window_keys, kind="stable")
    sorted_keys = window_keys[order]
    position = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.where(sorted_keys[position] == keys, order[position], -1)


def _blocking(comms: pd.DataFrame) -> pd.Series:
    """`blocking` where recorded; otherwise blocking unless `async` is true."""
    is_async = comms["async"].where(comms["async"].notna(), False).astype(bool)
    return comms["blocking"].where(comms["blocking"].notna(), ~is_async).astype(bool)


def span_bits(compute: np.ndarray, comm_wait: np.ndarray) -> np.ndarray:
    """The measures each span counts in (`IN_FLIGHT` ...), from which are compute phases and
    which comm_wait spans (boolean arrays); 0: none (other phases)."""
    bits = np.where(compute, EITHER | STAGE_WORK, 0)
    bits[comm_wait] = EXPOSED | EITHER | STAGE_WORK
    return bits


def comm_bits(blocking: np.ndarray, in_pipeline: np.ndarray) -> np.ndarray:
    """The measures each collective counts in, from which block the rank (`blocking`, as
    `_blocking` reads it) and which are in the pipeline group (boolean arrays, of any one
    shape)."""
    bits = np.full(np.shape(blocking), IN_FLIGHT)
    bits[blocking] |= EXPOSED | EITHER
    bits[blocking & ~in_pipeline] |= STAGE_WORK  # a wait for a pipeline neighbour is not
    return bits


def _measured(spans: pd.DataFrame, comms: pd.DataFrame) -> dict[str, np.ndarray]:
    """Every span and collective that some measure counts, as rank, step, t0, t1 and the
    measures' bits (`IN_FLIGHT` ...)."""
    phase = spans["phase"]
    of_spans = span_bits(
        _labels_in(phase, schema.COMPUTE_PHASES),
        _labels_in(phase, {schema.Phase.COMM_WAIT.value}),
    )
    of_comms = comm_bits(_blocking(comms).to_numpy(bool), in_pipeline(comms["group"], comms["op"]))
    return counted_records(spans, of_spans, comms, of_comms)


def counted_records(
    spans: Mapping[str, Any], of_spans: np.ndarray, comms: Mapping[str, Any], of_comms: np.ndarray
) -> dict[str, np.ndarray]:
    """The spans some measure counts and every collective, as rank, step, t0, t1 (integer
    columns of a table or packed arrays) and their bits (`span_bits`, `comm_bits`)."""
    counted = of_spans != 0
    return {
        name: np.concatenate([np.asarray(spans[name], np.int64)[counted],
                              np.asarray(comms[name], np.int64)])
        for name in ("rank", "step", "t0", "t1")
    } | {"bits": np.concatenate([of_spans[counted], of_comms])}  # fmt: skip


def in_pipeline(group: pd.Series, op: pd.Series) -> np.ndarray:
    """Which collectives are the pipeline's: those of its group, and sends and receives of no
    named group (P2P_OPS); waiting in them is the bubble, not the stage's work."""
    unnamed = group.isna().to_numpy(bool)
    return _labels_in(group, {PIPELINE_GROUP}) | (unnamed & _labels_in(op, P2P_OPS))


def _labels_in(column: pd.Series, labels: Collection[str]) -> np.ndarray:
    """Which rows hold one of `labels` (on a categorical's codes: one lookup per category)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        wanted = np.append(column.cat.categories.isin(list(labels)), False)  # code -1: null
        return wanted[column.cat.codes.to_numpy()]
    return column.isin(list(labels)).to_numpy(bool)


def time_breakdown(spans: pd.DataFrame, comms: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step) of `steps` (in their order): the wall time, and the unions of the
    spans and collectives inside the step's window, cut to it (MEASURES)."""
    windows = {name: steps[name].to_numpy(np.int64) for name in ("rank", "step", "t0", "t1")}
    return pd.DataFrame(step_measures(_measured(spans, comms), windows))


def step_measures(
    records: dict[str, np.ndarray], windows: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """`time_breakdown`'s columns from arrays: `records` (rank, step, t0, t1, bits: the spans
    and collectives some measure counts) and `windows` (rank, step, t0, t1: the steps)."""
    rows = _window_rows(records["rank"], records["step"], windows["rank"], windows["step"])
    return window_measures(rows, records, windows, np.arange(len(windows["t0"])))


def window_measures(
    keys: np.ndarray,
    records: dict[str, np.ndarray],
    windows: dict[str, np.ndarray],
    window_keys: np.ndarray,
) -> dict[str, np.ndarray]:
    """`step_measures` where one key per record finds its window: `keys` (one a record),
    `records` (t0, t1, bits; bits 0: a record no measure counts), `windows` (rank, step,
    t0, t1) and `window_keys` (one a window, ascending and distinct): each window's row, or
    for one rank's windows in step order, their steps."""
    w0, w1 = windows["t0"], windows["t1"]
    totals = union_lengths_in_windows(
        keys, records["t0"], records["t1"], records["bits"], window_keys, w0, w1, len(MEASURES)
    )
    measure = dict(zip(MEASURES, totals.T, strict=True))
    wall_ns = w1 - w0
    busy_ns = measure["either"] - measure["exposed"]
    idle_ns = np.clip(wall_ns - busy_ns - measure["exposed"], 0, None)
    return {
        "rank": windows["rank"],
        "step": windows["step"],
        "wall_s": wall_ns / NS_PER_S,
        "busy_s": busy_ns / NS_PER_S,
        "comm_s": measure["comm"] / NS_PER_S,
        "exposed_comm_s": measure["exposed"] / NS_PER_S,
        "idle_s": idle_ns / NS_PER_S,
        "stage_work_s": measure["stage_work"] / NS_PER_S,
    }


def rank_table(rank_steps: pd.DataFrame, manifest: schema.Manifest) -> pd.DataFrame:
    hosts = {info.rank: info.host for info in manifest.ranks}
    by_rank = rank_steps.groupby("rank")
    totals = by_rank[
        ["wall_s", "busy_s", "comm_s", "exposed_comm_s", "idle_s", "stage_work_s"]
    ].sum()
    table = pd.DataFrame({
        "rank": totals.index.astype("int64"),
        "host": [hosts.get(int(r)) for r in totals.index],
        "steps": by_rank.size().to_numpy(),
        "step_time_s": by_rank["wall_s"].mean().to_numpy(),
    })  # fmt: skip
    for name in totals.columns:
        table[name] = totals[name].to_numpy()
    wall = table["wall_s"].where(table["wall_s"] > 0)
    table["busy_frac"] = table["busy_s"] / wall
    table["comm_share"] = table["comm_s"] / wall
    table["exposed_comm_share"] = table["exposed_comm_s"] / wall
    table["idle_frac"] = table["idle_s"] / wall
    return table
