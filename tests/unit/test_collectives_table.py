"""The collectives table (diag/metrics/collectives.py, numpy over the collective totals) equals
the pandas group-by it replaced, bit for bit: categorical and plain labels, nulls in every key,
calls that do not say their bytes, group sizes unknown."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diag.api import load_any
from diag.metrics.collectives import COLLECTIVE_KEYS, collectives
from diag.metrics.comm_totals import run_comm_totals, weighted_median
from diag.metrics.common import analysed_steps
from diag.numeric.keys import in_steps
from diag.read.load import RunData


def reference(totals: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The table's numbers by pandas group-bys (the implementation before numpy)."""
    keys = COLLECTIVE_KEYS
    per_rank = totals.groupby([*keys, "rank"], dropna=False, observed=True).agg(
        count=("count", "sum"), bytes=("bytes", "sum"), measured=("measured", "sum"),
        expected_bytes=("expected_bytes", "sum"), expected=("expected", "sum"),
        duration_ns=("duration_ns", "sum"),
    )  # fmt: skip
    rank_steps = steps.groupby("rank").size().reindex(per_rank.index.get_level_values("rank"))
    per_rank["bytes"] = per_rank["bytes"].where(per_rank["measured"] > 0)
    per_rank["bytes_per_step"] = per_rank["bytes"] / rank_steps.to_numpy()
    per_rank["expected_bytes"] = per_rank["expected_bytes"].where(per_rank["expected"] > 0)
    per_rank = per_rank.drop(columns=["measured", "expected"]).astype("float64")
    table = per_rank.groupby(level=keys, dropna=False, sort=False).mean()
    by_collective = totals.groupby(keys, dropna=False, observed=True, sort=False)
    sizes = [
        weighted_median(g["group_size"].to_numpy(np.float64), g["count"].to_numpy(np.int64))
        for _, g in by_collective
    ]
    sums = by_collective.agg(all_ns=("duration_ns", "sum")).assign(group_size=sizes)
    table = table.join(sums).reset_index()
    table["time_s"] = table["duration_ns"] / 1e9
    table = table.sort_values("time_s", ascending=False, kind="stable").reset_index(drop=True)
    return table[[*keys, "count", "bytes", "bytes_per_step", "expected_bytes", "time_s"]]


GOLDEN_RUNS = Path(__file__).resolve().parents[1] / "data" / "golden-runs"


@pytest.fixture(scope="module", params=["tp", "pp"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RunData:
    folder = tmp_path_factory.mktemp("run") / request.param  # the cache stays out of tests/data
    shutil.copytree(GOLDEN_RUNS / request.param, folder)
    return load_any(folder)


@pytest.mark.parametrize("labels", ["categorical", "object"])
def test_table_equals_the_group_by(run: RunData, labels: str) -> None:
    steps, _ = analysed_steps(run.steps, run.starts_at_warmup)
    totals = run_comm_totals(run).copy()
    if labels == "object":  # as a large run's loader workers hand them over
        for key in COLLECTIVE_KEYS:
            totals[key] = totals[key].astype(object).where(totals[key].notna(), None)
    rows = totals.index
    totals.loc[rows[::5], "tag"] = None
    totals.loc[rows[::13], "group"] = None
    totals.loc[rows[::4], "group_size"] = np.nan
    totals.loc[rows[::9], "measured"] = 0
    table = collectives(totals, steps)
    expected = reference(totals.loc[in_steps(totals, steps)], steps)
    shared = [c for c in expected.columns if c not in COLLECTIVE_KEYS]
    pd.testing.assert_frame_equal(table[shared], expected[shared], check_exact=True)
    for key in ("op", "group"):
        pd.testing.assert_series_equal(table[key], expected[key], check_exact=True)
    assert table["tag"].tolist() == [None if pd.isna(t) else t for t in expected["tag"]]
