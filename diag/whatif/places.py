"""Statistics of one place of the step (its position and, for a floor, its kind of event) over
the ranks that do the same work there: the median of a rank's peers (same role), the mean of
its pipeline stage in that step, the least its stage ever took (the counterfactuals of
diag/whatif/attribution.py read them)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd

from diag.numeric.ordering import dense_key, group_medians, grouped_order, half_units


def group_codes(*keys: np.ndarray) -> np.ndarray:
    """One dense integer (0..G-1) per distinct combination of the key columns (integers)."""
    return pd.factorize(dense_key(*keys))[0]


def group_medians_per_element(codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per element, the median of its group's values (NaN values skipped; NaN for a group of
    NaN only): one sort of (group, value) as one integer where the values are exact halves."""
    medians = np.full(int(codes.max()) + 1 if len(codes) else 0, np.nan)
    valid = ~np.isnan(values)
    if valid.any():
        units = half_units(values[valid])
        found = (units, 2.0) if units is not None else (values[valid], 1.0)
        groups, valid_medians = group_medians(codes[valid], *found)
        medians[groups] = valid_medians
    return medians[codes]


def peer_medians(events: pd.DataFrame, role: pd.DataFrame) -> Callable[[np.ndarray], np.ndarray]:
    """A function: for values per event, the median of the same (step, place) over the
    other ranks of the event's role (NaN where the rank has no peer there)."""
    roles = role["role"].reindex(events["rank"].to_numpy()).to_numpy()
    codes = group_codes(roles, events["step"].to_numpy(), events["j"].to_numpy())
    # the members of each group in sorted order, whatever the values: for each, where the
    # two middle values of its group without it lie (after it: one further)
    count = np.bincount(codes)
    group = np.repeat(np.arange(len(count)), count)
    n, first = count[group], np.cumsum(count)[group] - count[group]
    place = np.arange(len(codes)) - first
    m = n - 1

    def without_member(i: np.ndarray) -> np.ndarray:
        return first + np.minimum(i + (i >= place), n - 1)

    low, high = without_member(np.maximum(m - 1, 0) // 2), without_member(m // 2)
    alone = n < 2

    def median_of_others(values: np.ndarray) -> np.ndarray:
        units = half_units(values)  # equal values in any order: the medians are the same
        order = np.lexsort((values, codes)) if units is None else grouped_order(codes, units)
        ordered = values[order]
        out = np.empty(len(values))
        out[order] = np.where(alone, np.nan, (ordered[low] + ordered[high]) / 2)
        return out

    return median_of_others


def stage_means(events: pd.DataFrame, role: pd.DataFrame) -> Callable[[np.ndarray], np.ndarray]:
    """A function: for values per event, the mean of the same (step, place) over the ranks of
    the event's pipeline stage (NaN where the rank is alone there)."""
    stages = role["stage"].reindex(events["rank"].to_numpy()).to_numpy()
    codes = group_codes(stages, events["step"].to_numpy(), events["j"].to_numpy())
    return partial(_over_group, codes, "mean")


def stage_floors(events: pd.DataFrame, role: pd.DataFrame) -> Callable[[np.ndarray], np.ndarray]:
    """A function: for values per event, the least of the same place over every step and
    every rank of the event's pipeline stage (NaN where the place was seen once). A place is
    its position in the step and the kind of event ending it: a step whose events differ (a
    one-off collective) does not lend its work to another kind of event."""
    return partial(_over_group, stage_places(events, role), "min")


def stage_places(events: pd.DataFrame, role: pd.DataFrame) -> np.ndarray:
    """Per event, a code for its place in its stage's steps: its stage, its position in the
    step and the kind of event ending it (the same work in every step and every rank of the
    stage)."""
    stages = role["stage"].reindex(events["rank"].to_numpy()).to_numpy()
    kinds = events["kind"].to_numpy().astype(np.int64)
    return group_codes(stages, events["j"].to_numpy(), kinds)


def _over_group(codes: np.ndarray, statistic: str, values: np.ndarray) -> np.ndarray:
    """Per element, `statistic` of its group's values (NaN for a group of one)."""
    grouped = pd.Series(values).groupby(codes)
    count = grouped.transform("size").to_numpy()
    return np.where(count < 2, np.nan, grouped.transform(statistic).to_numpy())
