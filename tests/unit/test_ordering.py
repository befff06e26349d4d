"""diag.numeric.ordering equals the pandas operations it replaces, ties and int64 overflow
included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.numeric.ordering import (
    by_key_then_value,
    dense_key,
    group_medians,
    grouped_order,
    half_units,
    lexicographic,
    occurrence,
)

HUGE = np.iinfo(np.int64).max // 4
"""Values this far apart overflow the combined key: the two-key fallback runs."""


@pytest.mark.parametrize("spread", [1_000, HUGE])
def test_orderings_equal_pandas(spread: int) -> None:
    rng = np.random.default_rng(7)
    key = rng.integers(0, 20, 5_000)
    value = rng.integers(0, 50, 5_000) * (spread // 50)  # many ties
    frame = pd.DataFrame({"key": key, "value": value})
    expected = frame.sort_values(["key", "value"], kind="stable").index.to_numpy()
    assert (by_key_then_value(key, value) == expected).all()
    cumcount = frame.iloc[expected].groupby("key").cumcount().sort_index().to_numpy()
    assert (occurrence(key, value) == cumcount).all()
    keys, medians = group_medians(key, value, 1e9)
    by_key = (frame["value"] / 1e9).groupby(frame["key"]).median()
    assert (keys == by_key.index.to_numpy()).all()
    assert (medians == by_key.to_numpy()).all()  # bit for bit


def test_empty() -> None:
    assert len(by_key_then_value(np.zeros(0), np.zeros(0))) == 0


@pytest.mark.parametrize("spread", [1_000, HUGE])
def test_lexicographic_equals_a_stable_sort_of_many_keys(spread: int) -> None:
    rng = np.random.default_rng(11)
    n = 4_000
    frame = pd.DataFrame({
        "rank": rng.integers(0, 30, n), "t": rng.integers(0, 40, n) * (spread // 40),
        "step": rng.integers(0, 3, n), "place": rng.integers(0, 5, n),
    })  # fmt: skip
    expected = frame.sort_values(["rank", "t", "step", "place"], kind="stable").index.to_numpy()
    got = lexicographic(*(frame[c].to_numpy() for c in ["rank", "t", "step", "place"]))
    assert (got == expected).all()


def test_occurrence_in_row_order_is_cumcount() -> None:
    rng = np.random.default_rng(3)
    rank, step, flag = rng.integers(0, 9, 2_000), rng.integers(5, 8, 2_000), rng.random(2_000) < 0.3
    expected = pd.DataFrame({"r": rank, "s": step, "f": flag}).groupby(["r", "s", "f"]).cumcount()
    assert (occurrence(dense_key(rank, step, flag)) == expected.to_numpy()).all()


@pytest.mark.parametrize("spread", [1_000, HUGE])
def test_grouped_order_sorts_by_key_then_value(spread: int) -> None:
    rng = np.random.default_rng(13)
    key, value = rng.integers(0, 20, 5_000), rng.integers(0, 50, 5_000) * (spread // 50)
    order = grouped_order(key, value)
    assert sorted(order.tolist()) == list(range(5_000))
    expected = np.lexsort((value, key))
    assert (key[order] == key[expected]).all() and (value[order] == value[expected]).all()


def test_half_units_only_where_exact() -> None:
    units = half_units(np.array([1.5, -2.0, 0.0, 3e9]))
    assert units is not None and units.tolist() == [3, -4, 0, 6_000_000_000]
    for bad in ([0.25], [np.nan], [np.inf], [-0.0], [2.0**53]):
        assert half_units(np.array(bad)) is None
    empty = half_units(np.zeros(0))
    assert empty is not None and len(empty) == 0


def test_group_medians_of_floats_equal_pandas() -> None:
    rng = np.random.default_rng(17)
    key, value = rng.integers(0, 20, 5_000), rng.integers(0, 50, 5_000) / 8
    keys, medians = group_medians(key, value)
    by_key = pd.Series(value).groupby(key).median()
    assert (keys == by_key.index.to_numpy()).all()
    assert (medians == by_key.to_numpy()).all()


def test_dense_key_groups_ranges_too_wide_for_one_integer() -> None:
    """Keys whose ranges multiplied overflow int64 (a hostile run's ranks, steps and flags:
    2**20 x 2**40 x 2**10 here) still group equal rows together and distinct ones apart; one
    integer would wrap, rank 2**14 landing on rank 0."""
    rank = np.array([0, 2**14, 2**20 - 1, 0])
    step = np.array([0, 0, 2**40 - 1, 0])
    flag = np.array([0, 0, 2**10 - 1, 0])
    key = dense_key(rank, step, flag)
    assert key[0] == key[3]
    assert len(set(key.tolist())) == 3
