"""The records a large run keeps whole: a window of its first steps.

A large run's workers reduce every span and collective to per-(rank, step) tables
(`file_reduction.py`) and keep only a window of the records themselves: the steps the replay and
the rules that match records across ranks read, at a size that does not grow with the world
(`RunData.span_steps`). `--steps` windows (`in_window`) drop records while parsing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from diag.contract import schema
from diag.contract.schema import RecordKind
from diag.numeric.keys import rank_steps_in
from diag.rankfile.rank_file import read_rank_file
from diag.rankfile.records import Encoded, Packed, take, unpack

SPAN_WINDOW_STEPS = 8
"""At most this many steps keep every span and collective in a large run (`RunData.span_steps`)"""
WINDOW_RECORDS = 1_500_000
"""...and fewer when the window would hold more spans and collectives than this (over all
ranks), but never fewer than MIN_WINDOW_STEPS: what the replay and the rules that match records
across ranks read, kept at a size that does not grow with the world. By default the replay
reads its first chunk (`whatif.chunks`: two steps of a run that large); late arrival and the
Timeline read the rest (a 1,024-rank 3D run: 4 steps, 330 records a rank and step). Replaying
every step reads the others from the rank files again (`record_spill.py`)."""
MIN_WINDOW_STEPS = 3
"""The warm-up step and two analysed steps: the fewest the replay compares."""


def window_steps(files: list[tuple[int, Path]], world_size: int) -> int:
    """How many first steps of a large run keep every span and collective: SPAN_WINDOW_STEPS,
    fewer when that would exceed WINDOW_RECORDS over the world (the records per rank and step
    counted in the first rank file), never fewer than MIN_WINDOW_STEPS."""
    sample = read_rank_file(*files[0]).columns
    steps = len(set(unpack([sample[RecordKind.STEP.value]["step"]]))) or 1
    records = sum(len(sample[kind]["step"]) for kind in (RecordKind.SPAN.value,
                                                          RecordKind.COMM.value))  # fmt: skip
    per_step = max(records / steps, 1.0) * max(world_size, len(files))
    fitting = int(WINDOW_RECORDS / per_step)
    return max(min(SPAN_WINDOW_STEPS, MIN_WINDOW_STEPS), min(SPAN_WINDOW_STEPS, fitting))


def in_window(table: dict[str, Packed], steps: range) -> dict[str, Packed]:
    """A packed table's rows whose step is in `steps`."""
    step = np.asarray(unpack([table["step"]]), dtype=np.int64)
    keep = (step >= steps.start) & (step < steps.stop)
    return table if keep.all() else {name: take(values, keep) for name, values in table.items()}


def kept_records(
    columns: dict[str, dict[str, Packed]], kind: str, keep_below: int
) -> dict[str, Packed]:
    """Some ranks' records of `kind` of the steps below `keep_below`, their comm_wait
    spans and the records of (rank, step)s without a step record (reported as orphans by the
    metrics)."""
    table, recorded = columns[kind], columns[RecordKind.STEP.value]
    step = np.asarray(unpack([table["step"]]), dtype=np.int64)
    keep = step < keep_below
    if kind == RecordKind.SPAN.value:
        keep |= labels_equal(table["phase"], schema.Phase.COMM_WAIT.value)
    keep |= without_step_record(
        np.asarray(unpack([table["rank"]]), dtype=np.int64), step,
        np.asarray(unpack([recorded["rank"]]), dtype=np.int64),
        np.asarray(unpack([recorded["step"]]), dtype=np.int64),
    )  # fmt: skip
    rows = np.flatnonzero(keep)  # a few of many: taken by index, not by a mask of them all
    return {
        name: take(values, keep) if isinstance(values, list)
        else Encoded(values.values, values.codes[rows]) if isinstance(values, Encoded)
        else values[rows]
        for name, values in table.items()
    }  # fmt: skip


def without_step_record(
    ranks: np.ndarray, steps: np.ndarray, recorded_ranks: np.ndarray, recorded_steps: np.ndarray
) -> np.ndarray:
    """Which records' (rank, step) has no step record: for one rank's records (a file's)
    over a range of steps not much wider than they are many, by a table over that range;
    else by `rank_steps_in`."""
    if len(steps) and len(recorded_steps):
        rank, low, high = ranks[0], int(steps.min()), int(steps.max())
        if high - low <= 4 * len(steps) + 1024 and (ranks == rank).all():
            mine = recorded_steps[(recorded_ranks == rank) & (recorded_steps >= low)
                                  & (recorded_steps <= high)]  # fmt: skip
            known = np.zeros(high - low + 1, dtype=bool)
            known[mine - low] = True
            return ~known[steps - low]
    return ~rank_steps_in(ranks, steps, recorded_ranks, recorded_steps)


def labels_equal(column: Packed, label: str) -> np.ndarray:
    """Which rows of a packed label column hold `label` (on the codes when it is encoded)."""
    if isinstance(column, Encoded):
        matches = np.array([value == label for value in column.values] or [False], dtype=bool)
        return np.take(matches, column.codes)
    return np.asarray(unpack([column]), dtype=object) == label
