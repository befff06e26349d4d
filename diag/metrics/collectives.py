"""Collectives per (op, group, tag): counts, bytes per step against the ledger, time and bus
bandwidth; and the per-layer TP collectives against the ledger (docs/metrics.md,
"Collectives")."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from diag import ledger
from diag.load import RunData
from diag.metrics.comm_totals import run_comm_totals, weighted_median
from diag.metrics.common import NS_PER_S, in_steps

COLLECTIVE_KEYS = ["op", "group", "tag"]


def collectives(totals: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per (op, group, tag), from the run's collective totals (`comm_totals`) of the analysed
    `steps`: calls and bytes per rank and step (the mean over ranks) against the ledger, time,
    the median group size and the bus bandwidth."""
    columns = [
        *COLLECTIVE_KEYS, "count", "bytes", "bytes_per_step", "expected_bytes", "ratio",
        "time_s", "group_size", "busbw_GBps",
    ]  # fmt: skip
    records = totals.loc[in_steps(totals, steps)]
    if records.empty:
        return pd.DataFrame(columns=columns)
    per_rank = records.groupby([*COLLECTIVE_KEYS, "rank"], dropna=False, observed=True).agg(
        count=("count", "sum"),
        bytes=("bytes", "sum"),
        measured=("measured", "sum"),  # profiler traces may not say (DeepEP, gloo)
        expected_bytes=("expected_bytes", "sum"),
        expected=("expected", "sum"),
        duration_ns=("duration_ns", "sum"),
    )
    steps_per_rank = steps.groupby("rank").size()
    rank_steps = steps_per_rank.reindex(per_rank.index.get_level_values("rank")).to_numpy()
    per_rank["bytes"] = per_rank["bytes"].where(per_rank["measured"] > 0)
    per_rank["bytes_per_step"] = per_rank["bytes"] / rank_steps
    per_rank["expected_bytes"] = per_rank["expected_bytes"].where(per_rank["expected"] > 0)
    per_rank = per_rank.drop(columns=["measured", "expected"]).astype("float64")
    table = per_rank.groupby(level=COLLECTIVE_KEYS, dropna=False, sort=False).mean()
    by_collective = records.groupby(COLLECTIVE_KEYS, dropna=False, observed=True, sort=False)
    sums = by_collective.agg(all_bytes=("bytes", "sum"), all_ns=("duration_ns", "sum"))
    # the median group size over each collective's calls (a totals row counts its calls);
    # iterating the same group-by gives the groups in the order of `sums`
    sums["group_size"] = [
        weighted_median(group["group_size"].to_numpy(np.float64),
                        group["count"].to_numpy(np.int64))
        for _, group in by_collective
    ]  # fmt: skip
    table = table.join(sums).reset_index()
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


TP_LAYER_TAG = r"^tp\.(?:attn|mlp)\.(fwd|bwd)$"
"""Tags of the per-layer TP collectives (reference_runs/tp_comms.py); the group is `tp`."""


def tp_vs_ledger(run: RunData, steps: pd.DataFrame) -> list[dict[str, Any]] | None:
    """Per op and direction, the per-layer TP collectives per rank and step against the ledger's
    2 x layers x microbatches of `micro_batch x seq x hidden x dtype` bytes each (sequence
    parallel: as many reduce-scatters and all-gathers). None without such collectives."""
    totals = run_comm_totals(run)
    comms = totals.loc[totals["group"] == "tp", ["rank", "step", "op", "tag", "count", "bytes"]]
    codes, tags = pd.factorize(comms["tag"])  # the regex runs once per distinct tag
    ways = [m.group(1) if (m := re.match(TP_LAYER_TAG, str(t))) else None for t in tags]
    direction = np.array([*ways, None], dtype=object)[codes]  # code -1 (null tag) -> None
    keep = pd.notna(direction) & in_steps(comms, steps)
    records = comms.loc[keep, ["op", "count", "bytes"]].assign(direction=direction[keep])
    model, layout = run.manifest.model, run.manifest.layout
    if records.empty or not model.layers or steps.empty:
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
    groups = records.groupby(["op", "direction"], observed=True)
    for (op, way), group in sorted(groups, key=lambda item: (item[0][0], item[0][1] != "fwd")):
        # a rank holds layers / pp of the model (its stage's): the ledger counts per rank
        count = (theory.forward if way == "fwd" else theory.backward) / (layout.pp or 1)
        measured = float(group["bytes"].sum()) / rank_steps
        expected = count * payload if payload else None
        rows.append({
            "op": op,
            "direction": way,
            "count_per_step": int(group["count"].sum()) / rank_steps,
            "ledger_count_per_step": count,
            "bytes_per_step": measured,
            "ledger_bytes_per_step": expected,
            "ratio": measured / expected if expected else None,
        })  # fmt: skip
    return rows
