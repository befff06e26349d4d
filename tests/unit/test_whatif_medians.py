"""The attribution's medians (per rank and place; over a rank's peers) equal the plain
definition bit for bit: halves, ties, NaN and -0.0 included (the fast path sorts integers)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.whatif.places import group_codes, group_medians_per_element, peer_medians, stage_floors


def _median(values: list[float]) -> float:
    ordered = sorted(values)  # stable: equal values (0.0 and -0.0) keep their order
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2


def _values(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    values = rng.integers(-4, 6, n).astype(np.float64)  # many ties
    if kind == "halves":
        values /= 2
    if kind == "signed zeros":
        values[rng.random(n) < 0.3] = -0.0
    if kind == "quarters":  # not exact halves: the float path
        values /= 4
    return values


def _bits(values: np.ndarray) -> list[int]:
    return np.asarray(values, dtype=np.float64).view(np.int64).tolist()


@pytest.mark.parametrize("kind", ["whole", "halves", "signed zeros", "quarters", "nan"])
def test_group_medians_are_the_medians_of_each_group(kind: str) -> None:
    rng = np.random.default_rng(5)
    rank, place = rng.integers(0, 12, 3_000), rng.integers(0, 30, 3_000)
    values = _values("halves" if kind == "nan" else kind, 3_000, rng)
    if kind == "nan":
        values[rng.random(3_000) < 0.4] = np.nan
        values[(rank == 3) & (place == 4)] = np.nan  # a group of NaN only
    codes = group_codes(rank, place)
    medians = {}
    for code in np.unique(codes):
        valid = [float(v) for v in values[codes == code] if not np.isnan(v)]
        medians[code] = _median(valid) if valid else np.nan
    expected = [medians[code] for code in codes]
    assert _bits(group_medians_per_element(codes, values)) == _bits(np.array(expected))


@pytest.mark.parametrize("kind", ["whole", "halves", "signed zeros", "quarters"])
def test_peer_medians_are_the_medians_of_the_other_ranks(kind: str) -> None:
    rng = np.random.default_rng(9)
    n = 2_000
    events = pd.DataFrame({"rank": rng.integers(0, 10, n), "step": rng.integers(0, 2, n),
                           "j": rng.integers(0, 40, n)})  # fmt: skip
    role = pd.DataFrame({"role": [r % 3 for r in range(10)]}, index=pd.Index(range(10)))
    values = _values(kind, n, rng)
    got = peer_medians(events, role)(values)
    keys = list(zip(events["rank"] % 3, events["step"], events["j"], strict=True))
    members: dict[tuple[int, int, int], list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    expected = []
    for i, key in enumerate(keys):
        others = [float(values[k]) for k in members[key] if k != i]
        expected.append(_median(others) if others else np.nan)
    assert _bits(got) == _bits(np.array(expected))


def test_stage_floors_are_the_least_of_a_place_over_the_stages_ranks_and_steps() -> None:
    """The floor of a place: the least over every rank of the stage and every step, the same
    kind of event only (a step whose events differ lends no work to another kind); NaN where
    the place was seen once."""
    rng = np.random.default_rng(3)
    n = 1_500
    events = pd.DataFrame({"rank": rng.integers(0, 8, n), "step": rng.integers(0, 4, n),
                           "j": rng.integers(0, 25, n), "kind": rng.integers(1, 3, n)})  # fmt: skip
    role = pd.DataFrame({"stage": [r // 4 for r in range(8)]}, index=pd.Index(range(8)))
    values = rng.random(n)
    got = stage_floors(events, role)(values)
    keys = list(zip(events["rank"] // 4, events["j"], events["kind"], strict=True))
    members: dict[tuple[int, int, int], list[float]] = {}
    for key, value in zip(keys, values, strict=True):
        members.setdefault(key, []).append(float(value))
    expected = [min(members[k]) if len(members[k]) > 1 else np.nan for k in keys]
    assert _bits(got) == _bits(np.array(expected))
