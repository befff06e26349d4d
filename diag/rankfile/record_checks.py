"""What makes a rank-file record unusable, on the loader's line-by-line path (`diag.read.load`): a
bad step, bad times, a label or an index of the wrong type, or a value beyond the bounds of
diag/contract/limits.py. Each check gives the reason the loader notes with the skipped record."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from diag.contract import schema
from diag.contract.limits import (
    MAX_ABS_TIME_NS,
    MAX_EXPERTS,
    MAX_INDEX,
    MAX_JSON_DEPTH,
    MAX_LABEL_CHARS,
    MAX_STEP,
)
from diag.contract.schema import RecordKind

KINDS = frozenset(kind.value for kind in RecordKind)
"""The record kinds the loader keeps (others are ignored, not checked)."""
TIMED = frozenset({RecordKind.STEP.value, RecordKind.SPAN.value, RecordKind.COMM.value})
LABELS: dict[str, tuple[str, ...]] = {
    RecordKind.SPAN.value: ("phase",),
    RecordKind.COMM.value: ("op", "group", "tag", "dtype"),
    RecordKind.MEM.value: ("source",),
    RecordKind.EXPERTS.value: ("layer",),
    RecordKind.EVENT.value: ("name",),
}
"""Fields the analysis groups by: each must be a string (of at most MAX_LABEL_CHARS), an
integer in 0..MAX_INDEX-1 or null."""
INDICES: dict[str, tuple[str, ...]] = {RecordKind.SPAN.value: ("mb", "stage", "chunk")}
"""Integers in 0..MAX_INDEX-1 or null."""


def check_values(record: dict[str, Any]) -> str | None:
    """The reason a schema-valid record is still unusable (a bad step, times, label or index, or a
    value beyond diag/contract/limits.py), or None."""
    kind = record["kind"]
    if kind not in KINDS:
        return None
    step = record["step"]
    if not is_int(step) or step < 0:
        return f"{kind} record with step {schema.shown(step)}, not an integer >= 0"
    if step >= MAX_STEP:
        return f"{kind} record with a step beyond the limit of 2**40"
    if kind in TIMED:
        t0, t1 = record["t0"], record["t1"]
        if not (finite(t0) and finite(t1)):
            return f"{kind} record with null or non-finite t0/t1"
        if max(abs(t0), abs(t1)) >= MAX_ABS_TIME_NS:
            return f"{kind} record with t0/t1 beyond ±2**62 ns"
        if t1 < t0:
            return f"{kind} record with t1 before t0"
        record["t0"], record["t1"] = int(t0), int(t1)
    for name in LABELS.get(kind, ()):
        value = record.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            if len(value) > MAX_LABEL_CHARS:
                return f"{kind} record whose {name} is longer than {MAX_LABEL_CHARS} characters"
        elif not is_int(value):
            return f"{kind} record whose {name} is not a string"
        elif not 0 <= value < MAX_INDEX:
            return f"{kind} record whose {name} is an integer outside 0..{MAX_INDEX - 1}"
    for name in INDICES.get(kind, ()):
        value = record.get(name)
        if value is not None and (not is_int(value) or not 0 <= value < MAX_INDEX):
            return f"{kind} record whose {name} is not an integer in 0..{MAX_INDEX - 1}"
    if kind == RecordKind.EXPERTS.value:
        tokens = record["tokens"]
        if not isinstance(tokens, list) or not all(finite(n) for n in tokens):
            return "experts record whose tokens is not a list of numbers"
        if len(tokens) > MAX_EXPERTS:
            return f"experts record whose tokens has more than {MAX_EXPERTS} entries"
    if kind == RecordKind.EVENT.value and depth(record) > MAX_JSON_DEPTH:
        return f"event record nested deeper than {MAX_JSON_DEPTH} levels"
    if _has_lone_surrogate(record):
        return f"{kind} record with a string that is not Unicode text (a lone surrogate)"
    return None


def _has_lone_surrogate(record: dict[str, Any]) -> bool:
    """Whether a key or string anywhere in the record (depth already bounded) holds a lone
    surrogate (JSON's `\\ud800`): it cannot be encoded as UTF-8 for pyarrow or a terminal."""
    pending: list[Any] = [record]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if not value.isascii() and schema.LONE_SURROGATE.search(value):
                return True
        elif isinstance(value, dict):
            pending += [*value.keys(), *value.values()]
        elif isinstance(value, list):
            pending += value
    return False


def float_tokens(record: dict[str, Any]) -> dict[str, Any]:
    """A checked experts record with its tokens as floats, as the typed decoder reads them (an
    integer beyond int64 would make an object column); other records as they are."""
    if record.get("kind") == RecordKind.EXPERTS.value:
        record["tokens"] = [float(n) for n in record["tokens"]]
    return record


def depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (a scalar 0, `[1]` 1), without recursion; stops
    counting past MAX_JSON_DEPTH."""
    deepest, stack = 0, [(value, 0)]
    while stack and deepest <= MAX_JSON_DEPTH:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def finite(value: Any) -> bool:
    """A number a float can hold (an integer beyond float's range is not: JSON allows one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value) < 2**1024 if isinstance(value, int) else math.isfinite(value)
