"""The checks and packing of an Arrow rank file's records (diag/rankfile/arrow_format.py `decode`):
which records are usable, by what diag/rankfile/record_checks.py checks on the JSONL path, and each
kept column as the loader packs it (diag/rankfile/records.py). Each check is one vectorised pass
over a column of the whole file's records, skipped where it cannot find anything (a column without
nulls has no null to reject)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from diag.contract.limits import (
    MAX_ABS_TIME_NS,
    MAX_EXPERTS,
    MAX_INDEX,
    MAX_JSON_DEPTH,
    MAX_LABEL_CHARS,
    MAX_LINE_BYTES,
    MAX_STEP,
)
from diag.rankfile.record_checks import depth
from diag.rankfile.records import INT_COLUMNS, Encoded, Packed

_F64 = pa.float64()
INDICES = frozenset({"mb", "stage", "chunk", "layer"})
"""Integer fields bounded like the JSONL reader's indices and integer labels."""
LABELS = frozenset({"phase", "op", "group", "dtype", "tag", "source", "name"})


def usable(
    kind: str, values: pa.StructArray, typed: Collection[str], rejected: Counter[str]
) -> np.ndarray:
    """Which records are usable (what diag/rankfile/record_checks.py checks on the JSONL path), with
    each rejected record's reason counted. `typed`: the kind's typed fields, the only ones checked
    (a file may carry fields this format does not name yet, unread)."""
    count = len(values)
    keep = np.ones(count, dtype=bool)
    if not count:
        return keep

    def reject(bad: np.ndarray, reason: str) -> None:
        fresh = bad & keep
        if fresh.any():
            rejected[reason] += int(fresh.sum())
            keep[fresh] = False

    if values.null_count:
        reject(_nulls(values), f"{kind} record that is null")
    step = values.field("step")
    if step.null_count:
        reject(_nulls(step), f"{kind} record with step null, not an integer >= 0")
    steps = _ints(step)
    reject(steps < 0, f"{kind} record with a negative step, not an integer >= 0")
    reject(steps >= MAX_STEP, f"{kind} record with a step beyond the limit of 2**40")
    names = set(typed)
    if "t0" in names:
        t0, t1 = values.field("t0"), values.field("t1")
        if t0.null_count or t1.null_count:
            reject(_nulls(t0) | _nulls(t1), f"{kind} record with null or non-finite t0/t1")
        a, b = _ints(t0), _ints(t1)
        far = (np.abs(a) >= MAX_ABS_TIME_NS) | (np.abs(b) >= MAX_ABS_TIME_NS)
        far |= (a == np.iinfo(np.int64).min) | (b == np.iinfo(np.int64).min)  # abs overflows
        reject(far, f"{kind} record with t0/t1 beyond ±2**62 ns")
        reject(b < a, f"{kind} record with t1 before t0")
    for name in sorted(names & INDICES):
        index = _ints(values.field(name), fill=0)
        reject((index < 0) | (index >= MAX_INDEX),
               f"{kind} record whose {name} is not an integer in 0..{MAX_INDEX - 1}")  # fmt: skip
    for name in sorted(names & LABELS):
        too_long = f"{kind} record whose {name} is longer than {MAX_LABEL_CHARS} characters"
        reject(_longer_than(values.field(name), MAX_LABEL_CHARS), too_long)
    if kind == "experts":
        tokens = values.field("tokens")
        reject(_nulls(tokens), "experts record whose tokens is not a list of numbers")
        lengths = pc.fill_null(pc.list_value_length(tokens), 0).to_numpy()
        reject(
            lengths > MAX_EXPERTS,
            f"experts record whose tokens has more than {MAX_EXPERTS} entries",
        )
        flat = pc.list_flatten(tokens)
        bad = pc.invert(pc.fill_null(pc.is_finite(flat), False)).to_numpy(zero_copy_only=False)
        parents = pc.list_parent_indices(tokens).to_numpy()
        not_numbers = np.zeros(count, dtype=bool)
        not_numbers[parents[bad]] = True
        reject(not_numbers, "experts record whose tokens is not a list of numbers")
    return keep


def _nulls(array: pa.Array) -> np.ndarray:
    return array.is_null().to_numpy(zero_copy_only=False)


def _ints(array: pa.Array, fill: int = 0) -> np.ndarray:
    return _filled(array, fill).to_numpy().astype(np.int64, copy=False)


def _longer_than(labels: pa.Array, max_chars: int) -> np.ndarray:
    """Which labels have more than `max_chars` characters (null: none). A label's UTF-8 bytes
    are at least its characters, so characters are counted only when some label's bytes
    exceed the bound (counting bytes reads the offsets alone)."""
    lengths = pc.binary_length(labels)
    too_long = _filled(lengths, 0).to_numpy() > max_chars
    if too_long.any():
        too_long = _filled(pc.utf8_length(labels), 0).to_numpy() > max_chars
    return too_long


def _filled(array: pa.Array, fill: Any) -> pa.Array:
    return pc.fill_null(array, fill) if array.null_count else array


def event_fields(
    extra: pa.Array, keep: np.ndarray, rejected: Counter[str]
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Each event's free fields (its `extra` JSON object) and which of them are usable."""
    ok = np.ones(len(extra), dtype=bool)
    fields: list[dict[str, Any]] = []
    for i, text in enumerate(extra.to_pylist()):
        value: Any = {}
        if text is not None and keep[i]:
            try:
                value = json.loads(text) if len(text) <= MAX_LINE_BYTES else None
            except (ValueError, RecursionError):
                value = None
            if not isinstance(value, dict) or depth(value) > MAX_JSON_DEPTH - 1:
                rejected[f"event record whose fields are not a JSON object of at most "
                         f"{MAX_JSON_DEPTH} levels"] += 1  # fmt: skip
                ok[i] = False
                value = {}
        fields.append(value)
    return fields, ok


def packed(array: pa.Array, name: str, numeric: bool) -> Packed:
    """A column as the loader packs it (diag/rankfile/records.py): int64 / float64 arrays, labels
    and nullable integers dictionary-encoded, lists as Python lists."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    if numeric:
        floats = array if kind == _F64 else array.cast(_F64)
        return _filled(floats, float("nan")).to_numpy(zero_copy_only=False)
    if name in INT_COLUMNS:
        return array.to_numpy()
    if pa.types.is_list(kind):
        return array.to_pylist()
    encoded = array.dictionary_encode(null_encoding="encode")
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    return Encoded(encoded.dictionary.to_pylist(), codes)
