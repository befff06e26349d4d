"""Collectives per (op, group, tag): counts, bytes per step against the ledger, time and bus
bandwidth; and the per-layer TP collectives against the ledger (docs/metrics.md,
"Collectives")."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import ledger
from diag.metrics.comm_totals import weighted_median
from diag.metrics.common import NS_PER_S, in_steps
from diag.read.load import RunData

COLLECTIVE_KEYS = ["op", "group", "tag"]


def collectives(totals: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per (op, group, tag), from the run's collective totals (`comm_totals`) of the analysed
    `steps`: calls and bytes per rank and step (the mean over ranks) against the ledger, time,
    the median group size and the bus bandwidth."""
    columns = [
        *COLLECTIVE_KEYS, "count", "bytes", "bytes_per_step", "expected_bytes", "ratio",
        "time_s", "group_size", "busbw_GBps",
    ]  # fmt: skip
    rows = np.flatnonzero(in_steps(totals, steps))
    if not len(rows):
        return pd.DataFrame(columns=columns)

    def column(name: str, dtype: type = np.float64) -> np.ndarray:
        return totals[name].to_numpy(dtype)[rows]

    collective, first_row = _collective_ids(totals, rows)
    table = _means_over_ranks(column, collective, steps)
    table["all_bytes"] = np.bincount(collective, weights=np.nan_to_num(column("bytes")))
    table["all_ns"] = np.bincount(collective, weights=column("duration_ns")).astype(np.int64)
    table["group_size"] = _median_group_sizes(collective, column("group_size"), column("count"))
    for key in reversed(COLLECTIVE_KEYS):
        table.insert(0, key, _key_column(totals[key].iloc[rows[first_row]]))
    table["tag"] = table["tag"].astype(object).where(table["tag"].notna(), None)
    table["ratio"] = table["bytes"] / table["expected_bytes"].where(table["expected_bytes"] > 0)
    table["time_s"] = table["duration_ns"] / NS_PER_S
    sizes = [None if pd.isna(n) or n < 1 else int(n) for n in table["group_size"]]
    table["group_size"] = pd.Series(sizes, index=table.index, dtype=object)
    table["busbw_GBps"] = [
        total / (ns / NS_PER_S) * ledger.bus_factor(str(op), n) / 1e9 if ns > 0 and n else None
        for op, n, total, ns in zip(
            table["op"], sizes, table["all_bytes"], table["all_ns"], strict=True
        )
    ]
    table = table.sort_values("time_s", ascending=False, kind="stable")
    return table[columns].reset_index(drop=True)


def _collective_ids(totals: pd.DataFrame, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per totals row of `rows`, a dense id of its (op, group, tag), numbered in the order a
    sorted group-by gives them (labels sorted, null last); and the first of `rows` of each."""
    combined, space = np.zeros(len(rows), dtype=np.int64), 1
    for key in COLLECTIVE_KEYS:
        codes, size = _sorted_codes(totals[key])
        combined, space = combined * size + codes[rows], space * size
    ids = _dense(combined, space)[1]
    first_row = np.full(int(ids.max()) + 1, len(ids), dtype=np.int64)
    np.minimum.at(first_row, ids, np.arange(len(ids)))
    return ids, first_row


def _key_column(labels: pd.Series) -> pd.Series:
    """A key column as a group-by's index gives it: a categorical stays one, other labels
    are inferred again (strings: pandas' string dtype, null NaN)."""
    if isinstance(labels.dtype, pd.CategoricalDtype):
        return labels.reset_index(drop=True)
    return pd.Series(labels.to_numpy())


def _sorted_codes(column: pd.Series) -> tuple[np.ndarray, int]:
    """A label column as codes in sorted label order (a categorical's category order), null
    the last code, and the number of codes."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes, labels = column.cat.codes.to_numpy(np.int64), len(column.dtype.categories)
    else:
        codes, uniques = pd.factorize(column, sort=True)
        labels = len(uniques)
    return np.where(codes < 0, labels, codes), labels + 1


def _dense(combined: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of `combined` (ints in 0..space-1, ascending) and each value's
    index among them: by a count over the key space where it is small, else a sort."""
    if space > 4 * len(combined) + 1024:
        distinct, inverse = np.unique(combined, return_inverse=True)
        return distinct, inverse.reshape(-1)
    present = np.bincount(combined, minlength=space) > 0
    return np.flatnonzero(present), (np.cumsum(present) - 1)[combined]


def _means_over_ranks(
    column: Callable[..., np.ndarray], collective: np.ndarray, steps: pd.DataFrame
) -> pd.DataFrame:
    """Per collective, the mean over ranks of each rank's calls, bytes (null where no call
    says), ledger bytes, time and bytes per step. Each rank's sums are of integers (exact in
    any order); the means over ranks stay pandas' (its compensated sum, bit for bit)."""
    ranks = column("rank", np.int64)
    low, width = int(ranks.min()), int(ranks.max()) - int(ranks.min()) + 1
    pair = collective * width + (ranks - low)  # (collective, rank), ascending
    pair, inverse = _dense(pair, (int(collective.max()) + 1) * width)

    def per_rank(name: str) -> np.ndarray:
        return np.bincount(inverse, weights=column(name))

    rank_steps = steps.groupby("rank").size().reindex(pair % width + low).to_numpy()
    bytes_ = np.where(per_rank("measured") > 0, per_rank("bytes"), np.nan)
    frame = pd.DataFrame({
        "count": per_rank("count"),
        "bytes": bytes_,
        "expected_bytes": np.where(per_rank("expected") > 0, per_rank("expected_bytes"), np.nan),
        "duration_ns": per_rank("duration_ns"),
        "bytes_per_step": bytes_ / rank_steps,
    })  # fmt: skip
    return frame.groupby(pair // width, sort=False).mean().reset_index(drop=True)


def _median_group_sizes(
    collective: np.ndarray, group_size: np.ndarray, count: np.ndarray
) -> list[float]:
    """Per collective, the median group size over its calls (a totals row counts its calls):
    from the calls summed per (collective, group size), the same repeated values."""
    size_codes, sizes = pd.factorize(group_size)  # null: -1, left out as weighted_median does
    collectives = int(collective.max()) + 1
    if not len(sizes):
        return [float("nan")] * collectives
    known = size_codes >= 0
    pair = collective[known] * len(sizes) + size_codes[known]
    calls = np.bincount(pair, weights=count[known], minlength=collectives * len(sizes))
    calls = calls.reshape(collectives, len(sizes)).astype(np.int64)
    values = np.asarray(sizes, dtype=np.float64)
    return [weighted_median(values, weights) for weights in calls]


TP_LAYER_TAG = r"^tp\.(?:attn|mlp)\.(fwd|bwd)$"
"""Tags of the per-layer TP collectives (reference_runs/tp_comms.py); the group is `tp`."""
DIRECTIONS = ("fwd", "bwd")


def tp_vs_ledger(
    run: RunData, totals: pd.DataFrame, steps: pd.DataFrame
) -> list[dict[str, Any]] | None:
    """Per op and direction, the per-layer TP collectives per rank and step against the ledger's
    2 x layers x microbatches of `micro_batch x seq x hidden x dtype` bytes each (sequence
    parallel: as many reduce-scatters and all-gathers). None without such collectives."""
    sums = _tp_layer_sums(totals, steps)
    model, layout = run.manifest.model, run.manifest.layout
    if not sums or not model.layers or steps.empty:
        return None
    theory = ledger.tp_allreduce_count(model.layers, layout.microbatches or 1)
    try:
        payload = ledger.tp_allreduce_bytes(
            model.micro_batch or 0, model.seq_len or 0, model.hidden or 0,
            ledger.dtype_bytes(model.dtype or "float32"),
        )  # fmt: skip
    except ValueError:
        payload = 0
    rank_steps = len(steps)
    rows = []
    for (op, way), (calls, measured_bytes) in sorted(
        sums.items(), key=lambda item: (item[0][0], item[0][1] != "fwd")
    ):
        # a rank holds layers / pp of the model (its stage's): the ledger counts per rank
        count = (theory.forward if way == "fwd" else theory.backward) / (layout.pp or 1)
        measured = measured_bytes / rank_steps
        expected = count * payload if payload else None
        rows.append({
            "op": op,
            "direction": way,
            "count_per_step": calls / rank_steps,
            "ledger_count_per_step": count,
            "bytes_per_step": measured,
            "ledger_bytes_per_step": expected,
            "ratio": measured / expected if expected else None,
        })  # fmt: skip
    return rows


def _tp_layer_sums(
    totals: pd.DataFrame, steps: pd.DataFrame
) -> dict[tuple[str, str], tuple[int, float]]:
    """Per (op, direction) of the per-layer TP collectives (group `tp`, a TP_LAYER_TAG tag) of
    `steps`: the calls and the bytes, summed."""
    tp = (totals["group"] == "tp").to_numpy(dtype=bool) & in_steps(totals, steps)
    tag_codes, tags = pd.factorize(totals["tag"])  # the regex runs once per distinct tag
    ways = [m.group(1) if (m := re.match(TP_LAYER_TAG, str(t))) else None for t in tags]
    way_codes = np.array([DIRECTIONS.index(w) if w else -1 for w in ways] + [-1])[tag_codes]
    op_codes, ops = pd.factorize(totals["op"])
    rows = np.flatnonzero(tp & (way_codes >= 0) & (op_codes >= 0))
    key = op_codes[rows] * len(DIRECTIONS) + way_codes[rows]
    space = len(ops) * len(DIRECTIONS)
    present = np.bincount(key, minlength=space) > 0
    calls = np.bincount(key, weights=totals["count"].to_numpy(np.float64)[rows], minlength=space)
    payload = np.nan_to_num(totals["bytes"].to_numpy(np.float64)[rows], nan=0.0)
    sent = np.bincount(key, weights=payload, minlength=space)
    return {
        (str(ops[k // len(DIRECTIONS)]), DIRECTIONS[k % len(DIRECTIONS)]): (
            int(calls[k]),
            float(sent[k]),
        )
        for k in np.flatnonzero(present)
    }
