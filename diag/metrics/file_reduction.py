"""What a large run's loader workers reduce its rank files to (`diag.read.load.Breakdown`): the
`rank_steps` time breakdown and the `comm_totals`, computed file by file from the packed columns the
reader made (numpy arrays and dictionary-encoded labels), with no table of records built. The
numbers are those `time_breakdown` and `comm_totals` give on the loaded tables (the same code
measures both; a test holds them equal), so a large run's metrics are a small run's.

One rank a file: each (rank, step) is reduced on its own, the loader may reduce a run a few
files at a time and concatenate. A file whose labels are not all strings (the readers'
checks should not let one through) is reduced through the tables instead.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.contract.schema import RecordKind
from diag.metrics.comm_totals import (
    TOTAL_COLUMNS,
    TOTAL_KEYS,
    Codes,
    comm_totals,
    empty_totals,
    prepare_comm_totals,
    totals_of,
)
from diag.metrics.common import WARMUP_MIN_STEPS, analysed_steps
from diag.metrics.time_breakdown import (
    P2P_OPS,
    PIPELINE_GROUP,
    comm_bits,
    span_bits,
    time_breakdown,
    window_measures,
)
from diag.numeric.intervals import prepare_union_lengths
from diag.rankfile.records import Encoded, Packed, concat
from diag.read.load import categorical, frame_of, numbers_of

RankColumns = dict[str, dict[str, Packed]]
"""One rank file's packed columns by record kind (diag/rankfile/rank_file.py)."""
LABEL_KEYS = ("op", "group", "tag")
"""The collective totals' keys that are labels."""


def reduce_rank_files(files: Iterable[RankColumns], warmup: bool = True) -> dict[str, pd.DataFrame]:
    """The `rank_steps` and `comm_totals` of some rank files, in file order (each file one
    rank; taken one at a time, so `files` may read each as it is asked for); `warmup`: the
    records start at the run's start, so each rank's first step is its warm-up
    (`analysed_steps`). An empty list: only load the compiled loops."""
    if isinstance(files, list) and not files:  # the loader's call before its workers start:
        prepare_union_lengths()  # they inherit the compiled loops
        prepare_comm_totals()
        return {}
    rank_steps: list[dict[str, np.ndarray]] = []
    totals: list[dict[str, Any]] = []
    for columns in files:
        encoded = _labels_encoded(columns)
        if encoded is None:  # not all strings: the tables' way, which takes any label
            steps, spans, comms = (frame_of(kind, columns[kind]) for kind in _KINDS)
            windows = analysed_steps(steps, warmup)[0]
            rank_steps.append(dict(time_breakdown(spans, comms, windows).items()))
            totals.append(dict(comm_totals(comms).items()))
            continue
        rank_steps.append(_rank_steps(columns, encoded, warmup))
        if len(columns[RecordKind.COMM.value]["step"]):
            totals.append(_comm_totals(columns[RecordKind.COMM.value], encoded))
    return {"rank_steps": _steps_frame(rank_steps), "comm_totals": _totals_frame(totals)}


_KINDS = (RecordKind.STEP.value, RecordKind.SPAN.value, RecordKind.COMM.value)


def _labels_encoded(columns: RankColumns) -> dict[str, Encoded] | None:
    """The label columns the reductions read, dictionary-encoded; None when a label is
    neither a string nor null."""
    wanted = {
        "phase": columns[RecordKind.SPAN.value]["phase"],
        **{name: columns[RecordKind.COMM.value][name] for name in LABEL_KEYS},
    }
    encoded = {name: _encoded(values) for name, values in wanted.items()}
    for table in encoded.values():
        if not all(label is None or isinstance(label, str) for label in table.values):
            return None
    comms = columns[RecordKind.COMM.value]
    encoded["async"], encoded["blocking"] = _encoded(comms["async"]), _encoded(comms["blocking"])
    return encoded


def _encoded(values: Packed) -> Encoded:
    """A packed column as a dictionary and codes, whatever way it was packed."""
    if isinstance(values, Encoded):
        return values
    rows = values.tolist() if isinstance(values, np.ndarray) else list(values)
    try:
        distinct = dict.fromkeys(rows)
    except TypeError:  # a list or a dict where a flag belongs (unchecked): each row its own
        return Encoded(rows, np.arange(len(rows), dtype=np.int64))
    code = {value: i for i, value in enumerate(distinct)}
    return Encoded(list(distinct), np.array([code[row] for row in rows], dtype=np.int64))


def _rank_steps(columns: RankColumns, labels: dict[str, Encoded], warmup: bool) -> dict:
    """`time_breakdown` of one rank file, from its packed columns: its spans and collectives
    find their window by their step (one rank: the steps of its windows are distinct)."""
    steps, spans, comms = (columns[kind] for kind in _KINDS)
    windows = _analysed_windows(steps, warmup)
    records = {name: _joined([spans[name], comms[name]]) for name in ("step", "t0", "t1")}
    records["bits"] = np.concatenate([_span_bits(labels), _comm_bits(labels)])
    return window_measures(records["step"], records, windows, windows["step"])


def _joined(parts: list[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(part, np.int64) for part in parts])


def _span_bits(labels: dict[str, Encoded]) -> np.ndarray:
    """The measures each span counts in (`span_bits`), looked up by its phase's code."""
    phase = labels["phase"]
    by_code = span_bits(
        _holds(phase.values, schema.COMPUTE_PHASES),
        _holds(phase.values, {schema.Phase.COMM_WAIT.value}),
    )
    return np.take(by_code, phase.codes)


def _comm_bits(labels: dict[str, Encoded]) -> np.ndarray:
    """The measures each collective counts in (`comm_bits`), looked up by its codes of
    blocking, async and group in `comm_bits` of every combination of their values; row by
    row where those are more than the rows (flags read line by line as lists: a code each)."""
    blocking, is_async, group = labels["blocking"], labels["async"], labels["group"]
    recorded, blocks = _flags(blocking.values)
    asynchronous = _flags(is_async.values)[1]
    in_pipeline = _holds(group.values, {PIPELINE_GROUP})
    op = labels.get("op")
    unnamed = np.array([value is None for value in group.values], dtype=bool)
    if op is not None and unnamed.any():  # sends and receives of no group (`in_pipeline`)
        rows = in_pipeline[group.codes] | (
            unnamed[group.codes] & _holds(op.values, P2P_OPS)[op.codes]
        )
        return comm_bits(
            np.where(recorded[blocking.codes], blocks[blocking.codes],
                     ~asynchronous[is_async.codes]), rows,
        )  # fmt: skip

    def bits_of(b: np.ndarray, a: np.ndarray, g: np.ndarray) -> np.ndarray:
        # `blocking` where recorded; otherwise blocking unless `async` is true
        return comm_bits(np.where(recorded[b], blocks[b], ~asynchronous[a]), in_pipeline[g])

    shape = (len(blocking.values), len(is_async.values), len(group.values))
    if math.prod(shape) > len(blocking.codes):
        return bits_of(blocking.codes, is_async.codes, group.codes)
    bits = bits_of(*np.meshgrid(*(np.arange(size) for size in shape), indexing="ij"))
    at = blocking.codes.astype(np.int64)  # the flat index of (blocking, async, group)
    at *= shape[1]
    at += is_async.codes
    at *= shape[2]
    at += group.codes
    return np.take(bits.ravel(), at)


def _holds(labels: list[Any], wanted: Collection[str]) -> np.ndarray:
    """Which labels of a dictionary are one of the `wanted` labels."""
    return np.array([label in wanted for label in labels], dtype=bool)


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _flags(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Which values of a flag's dictionary are recorded, and which are true where recorded
    (truthiness, as `time_breakdown._blocking` reads the table's columns)."""
    recorded = np.array([not _is_null(v) for v in values], dtype=bool)
    truth = np.array([not _is_null(v) and bool(v) for v in values], dtype=bool)
    return recorded, truth


def _analysed_windows(steps: dict[str, Packed], warmup: bool) -> dict[str, np.ndarray]:
    """One rank's analysed steps as `analysed_steps` leaves them (the last record of a
    repeated step, in step order, the first step dropped as warm-up when there are at least
    WARMUP_MIN_STEPS), as rank, step, t0, t1 arrays."""
    step = np.asarray(steps["step"], np.int64)
    if (step[1:] >= step[:-1]).all():  # written step by step: no sort
        order = np.arange(len(step))
    else:
        order = np.argsort(step, kind="stable")
    last = np.ones(len(order), dtype=bool)
    last[:-1] = step[order][1:] != step[order][:-1]  # the last of equal steps in file order
    kept = order[last]
    if warmup and len(kept) >= WARMUP_MIN_STEPS:
        kept = kept[1:]
    return {name: np.asarray(steps[name], np.int64)[kept] for name in ("rank", "step", "t0", "t1")}


def _comm_totals(comms: dict[str, Packed], labels: dict[str, Encoded]) -> dict[str, Any]:
    """`comm_totals` of one rank file's collectives, from its packed columns."""
    comm = RecordKind.COMM.value
    # as the tables read them: a file read line by line packs numbers as labels or lists
    measured = {
        name: numbers_of(comm, name, comms[name])
        for name in ("group_size", "bytes", "expected_bytes")
    }
    keys = [
        Codes.of_labels(*labels[name]) if name in LABEL_KEYS
        else Codes.of(measured[name] if name in measured else np.asarray(comms[name]))
        for name in TOTAL_KEYS
    ]  # fmt: skip
    numbers = {
        "bytes": measured["bytes"],
        "expected_bytes": measured["expected_bytes"],
        "t0": np.asarray(comms["t0"], np.int64),
        "t1": np.asarray(comms["t1"], np.int64),
    }
    return totals_of(keys, numbers)


def _steps_frame(parts: list[dict[str, np.ndarray]]) -> pd.DataFrame:
    return pd.DataFrame({name: np.concatenate([part[name] for part in parts]) for name in parts[0]})


def _totals_frame(parts: list[dict[str, Any]]) -> pd.DataFrame:
    """The files' totals as one table, the label keys categorical as the tables' are."""
    parts = [part for part in parts if len(part["rank"])]
    if not parts:
        return empty_totals()
    columns: dict[str, Any] = {}
    for name in TOTAL_COLUMNS:
        if name in LABEL_KEYS:  # under one dictionary (a file's are encoded, `Codes.of_labels`)
            labels = concat([_label_codes(part[name]) for part in parts])
            assert isinstance(labels, Encoded)
            columns[name] = categorical(labels)
        else:
            columns[name] = np.concatenate([np.asarray(part[name]) for part in parts])
    return pd.DataFrame(columns)


def _label_codes(column: Any) -> Encoded:
    """A totals' label column dictionary-encoded: a file's already is; the tables' way
    gives a categorical."""
    return column if isinstance(column, Encoded) else _encoded(np.asarray(column, dtype=object))
