"""Integer keys for (rank, step) pairs: membership tests on millions of records without a
merge (the loader's span window and the metrics' step selection share them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

KEYS = ["rank", "step"]


def rank_steps_in(ranks: Any, steps: Any, wanted_ranks: Any, wanted_steps: Any) -> np.ndarray:
    """Which (rank, step) pairs of `ranks`/`steps` are among the wanted pairs (a boolean
    array), one integer key per pair: far cheaper than a merge on millions of records."""
    ranks, steps = np.asarray(ranks, dtype=np.int64), np.asarray(steps, dtype=np.int64)
    wanted_ranks = np.asarray(wanted_ranks, dtype=np.int64)
    wanted_steps = np.asarray(wanted_steps, dtype=np.int64)
    if len(ranks) == 0 or len(wanted_ranks) == 0:
        return np.zeros(len(ranks), dtype=bool)
    width = int(max(steps.max(), wanted_steps.max())) + 1
    keys, wanted = ranks * width + steps, wanted_ranks * width + wanted_steps
    low = min(int(keys.min()), int(wanted.min()))
    space = max(int(keys.max()), int(wanted.max())) - low + 1
    if space > 4 * (len(keys) + len(wanted)) + 1024:  # a sparse key space: by sorting
        return np.isin(keys, wanted)
    present = np.zeros(space, dtype=bool)  # else a look-up table of the keys, no sort
    present[wanted - low] = True
    return present[keys - low]


def whole_steps(steps: pd.DataFrame, span_steps: int | None) -> pd.DataFrame:
    """The (rank, step)s of `steps` whose every span and collective a run holds: all of them,
    unless the run was too large and keeps every record only below `span_steps`
    (`RunData.span_steps`)."""
    return steps if span_steps is None else steps[steps["step"] < span_steps]


def in_steps(frame: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Which rows of `frame` belong to a (rank, step) of `steps` (a boolean array), with one
    integer key per pair: far cheaper than a merge on millions of records."""
    return rank_steps_in(
        frame["rank"].to_numpy(), frame["step"].to_numpy(),
        steps["rank"].to_numpy(), steps["step"].to_numpy(),
    )  # fmt: skip
