"""A rank's steps measured together: each step's kernels moved onto a stretch of the time axis
of its own (a band), so that one numpy pass gives every step's unions, covered times and
differences exactly as one pass per step did (issue 43: a communication-heavy rank's 250
steps spent a tenth of its parse in the per-step calls' overhead, on arrays of a few dozen
kernels).

A step's band starts where the previous one's ends plus PAD_NS: no union joins two steps'
intervals, no covered time counts another step's, and no time is within the send waits'
tolerance of another step's. Where the bands of every step would not fit in int64 (a hostile
trace's spans), each step is measured alone, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from diag.numeric import intervals
from diag.read.kineto.send_waits import RESUME_WITHIN_NS, send_waited

PAD_NS = 2 * RESUME_WITHIN_NS + 1
"""Between two steps' bands: more than the send waits' tolerance either way."""
LARGEST_BANDED = 2**62
"""The bands of every step end below this (int64), else each step is measured alone."""


@dataclass
class Bands:
    """Where each step's kernels lie once banded. `shift` (per kernel, int64; 0 for one in no
    step) is added to a kernel's times; `step_shift` and `band_starts` are per step; `sets`
    are the steps measured together (their places in the step list, all of them or one
    each) with their kernels."""

    shift: np.ndarray
    step_shift: np.ndarray
    band_starts: np.ndarray
    sets: list[tuple[np.ndarray, np.ndarray]]

    def unbanded(self, rows: np.ndarray, steps: np.ndarray) -> Iterator[tuple[int, list]]:
        """Banded (start, end) rows of the `steps` (a set's places, ascending), sorted, back in
        their own times: (step place, its rows as lists) for each step that has any, in
        order."""
        if not len(rows):
            return
        step = steps[np.searchsorted(self.band_starts[steps], rows[:, 0], side="right") - 1]
        back = rows - self.step_shift[step][:, None]
        edges = np.flatnonzero(np.diff(step)) + 1
        for part, chunk in zip(np.split(step, edges), np.split(back, edges), strict=True):
            yield int(part[0]), chunk.tolist()


def bands(t0: np.ndarray, t1: np.ndarray, arrived: np.ndarray, steps: list[np.ndarray]) -> Bands:
    """The bands of `steps` (each step's kernel indices); a step's times are its kernels'
    starts, ends and arrivals."""
    count = len(steps)
    if count == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Bands(np.zeros(len(t0), dtype=np.int64), empty, empty, [])
    kernels = np.concatenate(steps)
    sizes = np.array([len(step) for step in steps])
    firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    low = np.minimum.reduceat(np.minimum(t0, arrived)[kernels], firsts)
    high = np.maximum.reduceat(np.maximum(t1, np.maximum(t0, arrived))[kernels], firsts)
    band = int((high - low).max()) + 1 + PAD_NS
    if band * count < LARGEST_BANDED:
        band_starts = np.arange(count, dtype=np.int64) * band
        sets = [(np.arange(count), kernels)]
    else:  # measured one step at a time
        band_starts = np.zeros(count, dtype=np.int64)
        sets = [(np.array([place]), step) for place, step in enumerate(steps)]
    step_shift = band_starts - low
    shift = np.zeros(len(t0), dtype=np.int64)
    shift[kernels] = np.repeat(step_shift, sizes)
    return Bands(shift, step_shift, band_starts, sets)


@dataclass
class Covered:
    """Per kernel (a communication kernel's; 0 for others): how much of it its step's
    computation covers from its start and from its arrival to its end, and whether the rank
    waited for it were it a send (send_waits.py)."""

    hidden_ns: np.ndarray
    hidden_since_arrival_ns: np.ndarray
    waited: np.ndarray

    @classmethod
    def none(cls, kernels: int) -> Covered:
        zeros = np.zeros(kernels, dtype=np.int64)
        return cls(zeros, zeros.copy(), np.zeros(kernels, dtype=bool))

    def add(
        self, t0: np.ndarray, t1: np.ndarray, arrived: np.ndarray, busy: np.ndarray,
        comm: np.ndarray,
    ) -> None:  # fmt: skip
        """The `comm` kernels' by the `busy` ones (kernel indices, of one set of steps; their
        times banded)."""
        union = intervals.merge(np.column_stack([t0[busy], t1[busy]]))
        by_end = intervals.covered_before(union, t1[comm])
        self.hidden_ns[comm] = by_end - intervals.covered_before(union, t0[comm])
        self.hidden_since_arrival_ns[comm] = by_end - intervals.covered_before(union, arrived[comm])
        self.waited[comm] = send_waited(t0, t1, comm, busy)
