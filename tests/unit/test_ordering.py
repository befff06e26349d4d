"""diag.ordering equals the pandas operations it replaces, ties and int64 overflow included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.ordering import by_key_then_value, group_medians, occurrence

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
