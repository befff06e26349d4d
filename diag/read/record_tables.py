"""The tables of a run from its records' columns (diag/read/load.py gathers them): one pandas
DataFrame per record kind, with fixed columns and types, labels categorical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.contract.schema import Manifest, RecordKind
from diag.rankfile.rank_file import KEPT_COLUMNS, NUMERIC_COLUMNS, as_columns
from diag.rankfile.record_checks import finite
from diag.rankfile.records import Column, Encoded, Packed, concat, label_array, unpack
from diag.read.run_data import RunData

_CATEGORIES: dict[str, tuple[str, ...]] = {RecordKind.COMM.value: ("op", "group", "tag", "dtype")}
"""Labels repeated on millions of records: categorical (one small code a row)."""


def run_from_records(
    manifest: Manifest,
    path: Path,
    records: dict[str, list[dict[str, Any]]],
    skipped: list[str],
    packed: dict[str, list[dict[str, Packed]]] | None = None,
) -> RunData:
    """A RunData from record dicts by kind (the rank files' records, or a trace's converted).
    `packed`: kinds given instead as packed columns, one part per file in order (a worker
    packs what it parsed: a fraction of the dicts' memory in the process that gathers)."""
    columns = as_columns(records)
    for kind, parts in (packed or {}).items():
        columns[kind] = {
            name: gather(kind, name, [part.get(name, []) for part in parts])
            for name in KEPT_COLUMNS[kind]
        }
    return run_from_columns(manifest, path, columns, skipped)


def run_from_columns(
    manifest: Manifest, path: Path, columns: dict[str, dict[str, Column]], skipped: list[str]
) -> RunData:
    tables = {kind: _frame(kind, columns[kind]) for kind in KEPT_COLUMNS}
    tables["step"] = _drop_duplicate_steps(tables["step"], skipped)
    return RunData(
        manifest=manifest,
        path=path,
        steps=tables[RecordKind.STEP.value],
        spans=tables[RecordKind.SPAN.value],
        comms=tables[RecordKind.COMM.value],
        memory=tables[RecordKind.MEM.value],
        experts=tables[RecordKind.EXPERTS.value],
        events=tables[RecordKind.EVENT.value],
        skipped=skipped,
    )


def empty_run(manifest: Manifest, path: Path, skipped: list[str]) -> RunData:
    """A run of no records (what a Flight Recorder folder alone holds of the tables)."""
    return run_from_columns(
        manifest, path, {kind: {n: [] for n in names} for kind, names in KEPT_COLUMNS.items()},
        skipped,
    )  # fmt: skip


def gather(kind: str, name: str, parts: list[Packed]) -> Column | Encoded:
    """One column from its packed parts: a categorical column that every part
    dictionary-encoded stays encoded (`_frame` makes its categories from the dictionary, not
    from millions of decoded labels); others are unpacked."""
    if name in _CATEGORIES.get(kind, ()) and parts and all(isinstance(p, Encoded) for p in parts):
        merged = concat(parts)
        assert isinstance(merged, Encoded)
        return merged
    return unpack(parts)


def categorical(encoded: Encoded) -> pd.Categorical:
    """The column `astype("category")` would make of the decoded labels, built from the
    dictionary: the dictionary's own categorical (its categories sorted, its dtype inferred
    as for the whole column) indexed by the codes, unused categories dropped."""
    used = np.bincount(encoded.codes, minlength=len(encoded.values)) > 0
    values = [value for value, kept in zip(encoded.values, used.tolist(), strict=True) if kept]
    remap = np.cumsum(used) - 1  # old dictionary code -> code among the used values
    dictionary = pd.Series(label_array(values)).astype("category")
    codes = dictionary.cat.codes.to_numpy()[remap[encoded.codes]]
    return pd.Categorical.from_codes(codes, dtype=dictionary.dtype)


def frame_of(kind: str, columns: dict[str, Packed]) -> pd.DataFrame:
    """The table of one kind from its packed columns (a missing column: no rows)."""
    return _frame(kind, {n: gather(kind, n, [columns.get(n, [])]) for n in KEPT_COLUMNS[kind]})


def _frame(kind: str, columns: dict[str, Column | Encoded]) -> pd.DataFrame:
    """Build one table: fixed columns (missing fields are null), ints for rank/step/t0/t1."""
    names = list(KEPT_COLUMNS[kind])
    encoded = {name: v for name, v in columns.items() if isinstance(v, Encoded)}
    if len(columns[names[0]]):
        frame = pd.DataFrame(
            {name: categorical(v) if isinstance(v := columns[name], Encoded) else v
             for name in names},
            copy=False,
        )  # fmt: skip
    else:  # no rows: every column an object column (lists of nothing infer float)
        frame = pd.DataFrame(columns=names)
    for name in ("rank", "step", "t0", "t1"):
        if name in frame.columns:
            frame[name] = frame[name].astype("int64")
    for name in NUMERIC_COLUMNS.get(kind, ()):
        frame[name] = numeric_column(name, frame[name])
    for name in _CATEGORIES.get(kind, ()):
        if name not in encoded or not len(frame):
            frame[name] = frame[name].astype("category")
    return frame


def numeric_column(name: str, values: pd.Series) -> pd.Series:
    """A numeric field as the tables hold it: numbers as float64, anything else null, and
    infinities null too, but in `loss` (a diverged loss is data; an infinite byte count is
    not)."""
    try:
        numbers = pd.to_numeric(values, errors="coerce").astype("float64")
    except TypeError:  # lists or dicts where a number belongs: those become null
        kept = [v if finite(v) else None for v in values]
        numbers = pd.Series(kept, index=values.index, dtype="float64")
    return numbers if name == "loss" else numbers.where(np.isfinite(numbers))


def numbers_of(kind: str, name: str, packed: Packed) -> np.ndarray:
    """One packed numeric column of `kind` as `numeric_column` makes it, as an array (a
    float array, as the typed readers pack numbers, without pandas)."""
    if isinstance(packed, np.ndarray) and packed.dtype == np.float64:
        return packed if name == "loss" else np.where(np.isinf(packed), np.nan, packed)
    return numeric_column(name, pd.Series(gather(kind, name, [packed]))).to_numpy()


def _drop_duplicate_steps(steps: pd.DataFrame, skipped: list[str]) -> pd.DataFrame:
    duplicated = steps.duplicated(["rank", "step"], keep="last")
    if duplicated.any():
        ranks = sorted(steps.loc[duplicated, "rank"].unique())
        files = ", ".join(schema.rank_file_name(int(r)) for r in ranks)
        skipped.append(
            f"{files}: {int(duplicated.sum())} repeated step records, the last of each kept"
        )
        steps = steps.loc[~duplicated].reset_index(drop=True)
    return steps
