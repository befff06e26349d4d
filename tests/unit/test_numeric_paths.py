"""The numeric helpers' two ways to one answer: `union_lengths_in_windows` in numpy (where numba
is not loaded, diag/numeric/window_unions.py) gives the loop's totals to the bit; and where numba
caches the compiled loops (diag/numeric/compiled.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from diag.numeric import compiled, intervals
from diag.numeric.window_unions import window_unions


@pytest.mark.parametrize("seed", range(5))
def test_the_numpy_window_unions_equal_the_loops(seed: int) -> None:
    """Random windows and intervals: keys in no window, empty and reversed intervals, cuts at
    the windows' edges, every combination of measure bits; non-consecutive window keys."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        count, windows = int(rng.integers(0, 80)), int(rng.integers(0, 7))
        window_keys = np.sort(rng.choice(np.arange(-3, 12), size=windows, replace=False))
        window_starts = rng.integers(-50, 50, windows)
        window_ends = window_starts + rng.integers(-10, 120, windows)
        keys = rng.integers(-4, 13, count)
        starts = rng.integers(-100, 100, count)
        ends = starts + rng.integers(-20, 60, count)
        bits = rng.integers(0, 16, count)
        given = [np.ascontiguousarray(a, dtype=np.int64) for a in
                 (keys, starts, ends, bits, window_keys, window_starts, window_ends)]  # fmt: skip
        expected = intervals._window_unions_loop(*given, 4)
        assert (window_unions(*given, 4) == expected).all()


def test_small_inputs_are_measured_without_numba() -> None:
    """Below NUMPY_UNIONS_UP_TO intervals a process without the compiled loop uses numpy."""
    if compiled.is_loaded(intervals._window_unions_loop):
        pytest.skip("this test process loaded the compiled loop already")
    one = np.array([0], dtype=np.int64)
    totals = intervals.union_lengths_in_windows(one, one, one + 5, one + 1, one, one, one + 3, 1)
    assert totals.tolist() == [[3]]
    assert not compiled.is_loaded(intervals._window_unions_loop)


def test_numba_caches_beside_a_writable_package_else_in_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", "")  # unset (and put back after the test)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compiled.use_user_cache_folder(tmp_path) is None
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only package folder
    assert compiled.use_user_cache_folder(tmp_path) == tmp_path / "xdg" / "diag" / "numba"
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "xdg" / "diag" / "numba")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "chosen"))
    assert compiled.use_user_cache_folder(tmp_path) == tmp_path / "chosen"
