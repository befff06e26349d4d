"""The Arrow rank file decoder as it was before the per-file cost was cut
(diag/rankfile/arrow_format.py at commit fb72f26, its reading functions verbatim): the reference
that tests/unit/test_arrow_decode.py holds today's `decode` to, output for output."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
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
    MAX_NOTES_PER_FILE,
    MAX_STEP,
)
from diag.rankfile.arrow_format import (
    EXTRA,
    KIND_FIELDS,
    OTHER,
    ArrowRank,
    check_schema,
    kind_type,
)
from diag.rankfile.arrow_messages import is_compressed as _compressed
from diag.rankfile.record_checks import depth
from diag.rankfile.records import INT_COLUMNS, Encoded, Packed

INDICES = frozenset({"mb", "stage", "chunk", "layer"})
LABELS = frozenset({"phase", "op", "group", "dtype", "tag", "source", "name"})
_F64, _STR = pa.float64(), pa.string()


def decode(
    data: bytes,
    name: str,
    columns: Mapping[str, tuple[str, ...]],
    floats: Mapping[str, Iterable[str]],
) -> ArrowRank:
    """Decode one rank file's bytes into the loader's columns (`columns`: by kind, the names it
    keeps; `floats`: by kind, the numeric ones, NaN for null)."""
    batches, notes, error = _read_batches(data, name)
    if error is not None:
        return ArrowRank(skipped=[f"{name}: {error}"], fatal=True)
    out = ArrowRank(skipped=notes)
    rejected: Counter[str] = Counter()
    for kind in KIND_FIELDS:
        values = _values(batches, kind)
        keep = _checks(kind, values, rejected)
        free: list[dict[str, Any]] = []
        if kind == "event":
            free, ok = _event_fields(values.field(EXTRA), keep, rejected)
            keep &= ok
        values = values.filter(pa.array(keep)) if not keep.all() else values
        table: dict[str, Packed] = {}
        for col in columns[kind]:
            if col == "rank":
                continue
            if kind == "event" and col == "fields":
                table[col] = [f for f, k in zip(free, keep.tolist(), strict=True) if k]
            else:
                table[col] = _packed(values.field(col), col, col in floats.get(kind, ()))
        if kind == "step" and len(values):
            out.nan_loss = int(pc.sum(pc.is_nan(values.field("loss"))).as_py() or 0)
        out.columns[kind] = table
    other = pa.chunked_array([b.column(OTHER).flatten() for b in batches], _STR)
    out.other_lines = [line.encode() for line in other.to_pylist() if line is not None]
    for i, (reason, count) in enumerate(rejected.items()):
        if i == MAX_NOTES_PER_FILE:
            out.skipped.append(f"{name}: {sum(list(rejected.values())[i:])} more records "
                               f"skipped ({len(rejected) - i} other reasons)")  # fmt: skip
            break
        out.skipped.append(f"{name}: {count} {'record' if count == 1 else 'records'} skipped "
                           f"({reason})")  # fmt: skip
    return out


def _read_batches(data: bytes, name: str) -> tuple[list[pa.RecordBatch], list[str], str | None]:
    """The stream's complete batches, a note when it ends in an incomplete or unreadable one,
    or the reason the whole file is unusable (no valid schema of this format)."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
    try:
        message = reader.read_next_message()
        if message.type != "schema":
            return [], [], "not an Arrow rank file (no schema message first)"
        stream_schema = pa.ipc.read_schema(message)
    except StopIteration:
        return [], [], "empty Arrow stream (no schema)"
    except (pa.ArrowException, OSError, ValueError):
        return [], [], "not an Arrow IPC stream (or its schema is cut short)"
    wrong = check_schema(stream_schema)
    if wrong is not None:
        return [], [], wrong
    batches: list[pa.RecordBatch] = []
    problem = None
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError):
            problem = "ends in an incomplete or unreadable message (a rank killed mid-write?)"
            break
        if message.type != "record batch":
            problem = f"holds a {message.type} message, not a record batch"
            break
        if _compressed(message.metadata.to_pybytes()):
            problem = "holds a compressed record batch (this format writes none)"
            break
        try:
            batch = pa.ipc.read_record_batch(message, stream_schema)
            batch.validate(full=True)
        except (pa.ArrowException, OSError, ValueError):
            problem = "holds a corrupt record batch"
            break
        batches.append(batch)
    notes = []
    if problem is not None:
        plural = "batch" if len(batches) == 1 else "batches"
        notes.append(f"{name}: {problem}; read up to there ({len(batches)} complete {plural} "
                     "kept, the rest skipped)")  # fmt: skip
    return batches, notes, None


def _values(batches: list[pa.RecordBatch], kind: str) -> pa.StructArray:
    """A kind's records over every batch, as one struct array of the typed fields."""
    wanted = kind_type(kind)
    if not batches:
        return pa.array([], type=wanted)
    lists = [batch.column(kind) for batch in batches]
    values = (pa.concat_arrays(lists) if len(lists) > 1 else lists[0]).flatten()
    # a typed field added since (diag.rankfile.arrow_format.ADDED_FIELDS) reads as null where absent
    children = [values.field(f.name) if values.type.get_field_index(f.name) >= 0
                else pa.nulls(len(values), f.type) for f in wanted]  # fmt: skip
    mask = values.is_null() if values.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(wanted), mask=mask)


def _checks(kind: str, values: pa.StructArray, rejected: Counter[str]) -> np.ndarray:
    """Which records are usable (what diag/rankfile/record_checks.py checks on the JSONL path), with
    each rejected record's reason counted."""
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
        reject(values.is_null().to_numpy(zero_copy_only=False), f"{kind} record that is null")
    step = values.field("step")
    reject(_nulls(step), f"{kind} record with step null, not an integer >= 0")
    steps = _ints(step)
    reject(steps < 0, f"{kind} record with a negative step, not an integer >= 0")
    reject(steps >= MAX_STEP, f"{kind} record with a step beyond the limit of 2**40")
    names = {f.name for f in values.type}
    if "t0" in names:
        t0, t1 = values.field("t0"), values.field("t1")
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
        lengths = pc.fill_null(pc.utf8_length(values.field(name)), 0)
        too_long = f"{kind} record whose {name} is longer than {MAX_LABEL_CHARS} characters"
        reject(lengths.to_numpy() > MAX_LABEL_CHARS, too_long)
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
    return pc.fill_null(array, fill).to_numpy().astype(np.int64, copy=False)


def _event_fields(
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


def _packed(array: pa.Array, name: str, numeric: bool) -> Packed:
    """A column as the loader packs it (diag/rankfile/records.py): int64 / float64 arrays, labels
    and nullable integers dictionary-encoded, lists as Python lists."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    if numeric:
        return pc.fill_null(array.cast(_F64), float("nan")).to_numpy(zero_copy_only=False)
    if name in INT_COLUMNS:
        return array.to_numpy()
    if pa.types.is_list(kind):
        return array.to_pylist()
    encoded = array.dictionary_encode(null_encoding="encode")
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    return Encoded(encoded.dictionary.to_pylist(), codes)
