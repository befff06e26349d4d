"""A record kind of an Arrow rank file packed straight from the fast path's concatenated
buffers (diag/arrow_fast.py), without pyarrow arrays, when no record of it would be rejected.

`arrow_checks.usable` rejects a record for a null or negative step, a step beyond MAX_STEP,
null or far times, t1 before t0, an index outside 0..MAX_INDEX-1, a label longer than
MAX_LABEL_CHARS; `packed_kind` answers None (the kind takes `arrow_format.decoded`'s way,
which names every rejected record) unless none of those can happen, so that it never needs
the reasons. Then each column is what `arrow_checks.packed` makes of it: numbers as float64
with NaN for null, the integer columns as int64, labels dictionary-encoded. Kinds whose
records need more (expert loads' lists, events' free fields) always take the other way.
tests/unit/test_arrow_fast.py holds both ways to the same output.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from diag.arrow_checks import INDICES, LABELS
from diag.arrow_format import KIND_FIELDS
from diag.limits import MAX_ABS_TIME_NS, MAX_INDEX, MAX_LABEL_CHARS, MAX_STEP
from diag.records import INT_COLUMNS, Packed

if TYPE_CHECKING:
    from diag.arrow_fast import Field, _Buffers

PACKED_KINDS = frozenset({"step", "span", "comm", "mem"})
"""The kinds packed here: fixed-width numbers and labels only."""


def packed_kind(
    buffers: _Buffers, kind: str, names: Collection[str], floats: Collection[str]
) -> tuple[dict[str, Packed], int] | None:
    """A kind's columns `names` (but `rank`) as `arrow_checks.packed` packs them, and how many
    of its records have a NaN loss; None when a record might be rejected or a column is not
    one this packs."""
    if kind not in PACKED_KINDS or not buffers.records(kind):
        return None
    fields = {name: buffers.field(kind, name) for name, _ in KIND_FIELDS[kind]}
    if not _all_usable(fields):
        return None
    table: dict[str, Packed] = {}
    for name in names:
        if name == "rank":
            continue
        field = fields.get(name)
        if field is None:
            return None
        if name in floats:  # counters (int64) read as floats, as `arrow_checks.packed` casts
            if field.type not in (pa.float64(), pa.int64()):
                return None
            table[name] = _floats(field)
        elif name in INT_COLUMNS:
            if field.type != pa.int64() or field.valid is not None:
                return None
            table[name] = field.values
        else:
            encoded = buffers.encoded(kind, name)
            if encoded is None:
                return None
            table[name] = encoded
    loss = fields.get("loss")
    nan_loss = 0 if loss is None else int(np.isnan(_floats(loss)).sum() - _nulls(loss))
    return table, nan_loss


def _all_usable(fields: dict[str, Field | None]) -> bool:
    """Whether `arrow_checks.usable` keeps every record of these fields (by name)."""
    step, t0, t1 = fields.get("step"), fields.get("t0"), fields.get("t1")
    if step is None or not _whole_ints(step, 0, MAX_STEP):
        return False
    if t0 is not None or t1 is not None:
        if t0 is None or t1 is None:
            return False
        if not (_whole_ints(t0, -MAX_ABS_TIME_NS + 1, MAX_ABS_TIME_NS) and
                _whole_ints(t1, -MAX_ABS_TIME_NS + 1, MAX_ABS_TIME_NS)):  # fmt: skip
            return False
        if len(t0.values) and (t1.values < t0.values).any():
            return False
    for name, field in fields.items():
        if field is None:
            return False
        if name in INDICES:
            numbers = field.values if field.valid is None else field.values[field.valid]
            if field.type != pa.int64() or not _within(numbers, 0, MAX_INDEX):
                return False
        elif name in LABELS:
            if field.type != pa.string():
                return False
            lengths = np.diff(field.values)
            if field.valid is not None:
                lengths = lengths[field.valid]
            if len(lengths) and lengths.max() > MAX_LABEL_CHARS:  # ASCII: bytes are characters
                return False
    return True


def _whole_ints(field: Field, low: int, high: int) -> bool:
    """An int64 field without nulls, every value in low..high-1."""
    return field.type == pa.int64() and field.valid is None and _within(field.values, low, high)


def _within(numbers: np.ndarray, low: int, high: int) -> bool:
    return not len(numbers) or (int(numbers.min()) >= low and int(numbers.max()) < high)


def _floats(field: Field) -> np.ndarray:
    """A float64 (or int64) field as `packed` makes it: float64, NaN where null."""
    values = field.values.astype(np.float64, copy=False)
    if field.valid is None:
        return values
    return np.where(field.valid, values, np.nan)


def _nulls(field: Field) -> int:
    return 0 if field.valid is None else int((~field.valid).sum())
