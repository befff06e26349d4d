"""Hostile JSONL rank files: rank 1's file replaced (garbage, NUL bytes, empty) or given one bad
line: truncated, invalid UTF-8, wrong types, NaN, negative durations, huge integers and step
indices, deep nesting, a 60 MB line.

The cases and the contract: tests/unit/hostile_corpus.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import BASE_NS
from tests.unit.hostile_corpus import (
    Text,
    as_bytes,
    deep,
    family_tests,
    garbage,
    usable,
    valid_run,
)


def rank1_bytes(data: bytes) -> Callable[[Path], Path]:
    """Rank 1's file replaced by `data`."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / "rank-00001.jsonl").write_bytes(data)
        return run

    return build


def rank1_line(line: Text) -> Callable[[Path], Path]:
    """One line added to rank 1's file."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        with (run / "rank-00001.jsonl").open("ab") as fh:
            fh.write(as_bytes(line) + b"\n")
        return run

    return build


def record(**fields: Any) -> str:
    """A span of rank 1's step 1 with `fields` changed (a JSON line)."""
    base = {"kind": "span", "step": 1, "mb": 0, "phase": "fwd", "t0": BASE_NS, "t1": BASE_NS + 5}
    return json.dumps({**base, **fields})


def comm(**fields: Any) -> str:
    """An all-reduce of rank 1's step 1 with `fields` changed."""
    base = {"kind": "comm", "op": "all_reduce", "group": "dp", "group_size": 2, "bytes": 8}
    return record(**{**base, **fields})


def experts(tokens: str = "[1, 2]", layer: str = "0") -> str:
    """An experts record, its tokens and layer as JSON text."""
    return f'{{"kind": "experts", "step": 1, "layer": {layer}, "tokens": {tokens}}}'


def event(value: str) -> str:
    """An event with one free field, given as JSON text."""
    return f'{{"kind": "event", "step": 1, "name": "x", "f": {value}}}'


def step(number: int, t0: int = 1, t1: int = 2, loss: str = "1.0") -> str:
    return f'{{"kind": "step", "step": {number}, "t0": {t0}, "t1": {t1}, "loss": {loss}}}'


LONG_LINE = 60 * 2**20
CASES = {
    # truncated
    "run.truncated/line": usable(rank1_line('{"kind": "span", "st'), 2, "not valid JSON", cli=True),
    "run.truncated/utf8": usable(
        rank1_line(record(phase="é" * 30).encode()[:-25]), 2, "not valid JSON"
    ),
    # garbage
    "run.garbage/rank-file": usable(rank1_bytes(garbage(65536)), 1, "not valid JSON", cli=True),
    "run.garbage/nul-bytes": usable(rank1_bytes(b"\0" * 10000), 1, "not valid JSON"),
    "run.garbage/invalid-utf8-line": usable(
        rank1_line(b'{"kind": "span", "phase": "\xff\xfe"}'), 2, "not valid JSON"
    ),
    # empty
    "run.empty/rank-file": usable(rank1_bytes(b""), 1, "rank-00001.jsonl: empty", cli=True),
    "run.empty/blank-rank-file": usable(rank1_bytes(b"\n \n\t\n"), 1, "rank-00001.jsonl: empty"),
    # wrong types
    "run.types/step-string": usable(
        rank1_line(record(step="1")), 2, "not an integer >= 0", cli=True
    ),
    "run.types/t0-string": usable(rank1_line(record(t0="soon")), 2, "null or non-finite t0/t1"),
    "run.types/phase-list": usable(rank1_line(record(phase=["fwd"])), 2, "phase is not a string"),
    "run.types/mb-string": usable(rank1_line(record(mb="0")), 2, "mb is not an integer"),
    "run.types/stage-float": usable(rank1_line(record(stage=1.5)), 2, "stage is not an integer"),
    "run.types/tokens-dict": usable(rank1_line(experts('{"a": 1}')), 2, "not a list of numbers"),
    "run.types/record-is-array": usable(rank1_line("[1, 2, 3]"), 2, "not a JSON object"),
    "run.types/record-is-number": usable(rank1_line("12"), 2, "not a JSON object"),
    # NaN and infinities
    "run.nan/t0": usable(
        rank1_line(record(t0=float("nan"))), 2, "null or non-finite t0/t1", cli=True
    ),
    "run.nan/t1-inf": usable(rank1_line(record(t1=float("inf"))), 2, "null or non-finite t0/t1"),
    "run.nan/tokens-inf": usable(rank1_line(experts("[1, Infinity]")), 2, "not a list of numbers"),
    "run.nan/loss": usable(rank1_line(step(5, loss="NaN")), 2, "loss is NaN"),
    "run.nan/bytes": usable(rank1_line(comm(bytes=float("nan"))), 2, None),
    # negative durations
    "run.negative-duration/span": usable(
        rank1_line(record(t1=BASE_NS - 5)), 2, "t1 before t0", cli=True
    ),
    "run.negative-duration/step": usable(rank1_line(step(7, t0=9, t1=2)), 2, "t1 before t0"),
    "run.negative-duration/comm": usable(rank1_line(comm(t1=BASE_NS - 5)), 2, "t1 before t0"),
    # huge integers
    "run.huge/step-2**70": usable(rank1_line(record(step=2**70)), 2, "step", cli=True),
    "run.huge/t0-2**70": usable(rank1_line(record(t0=2**70, t1=2**70 + 1)), 2, "t0/t1"),
    "run.huge/t0-2**62": usable(rank1_line(record(t0=-(2**62), t1=2**62)), 2, "t0/t1"),
    "run.huge/bytes-10**30": usable(rank1_line(comm(group_size=10**30, bytes=10**30)), 2, None),
    "run.huge/mb-10**30": usable(rank1_line(record(mb=10**30)), 2, "mb is not an integer"),
    "run.huge/stage-2**70": usable(rank1_line(record(stage=2**70)), 2, "stage is not an integer"),
    "run.huge/chunk-2**40": usable(rank1_line(record(chunk=2**40)), 2, "chunk is not an integer"),
    "run.huge/layer-2**70": usable(rank1_line(experts(layer=str(2**70))), 2, "layer"),
    # found by test_fuzz_readers: an integer below int64 made an object column on the
    # line-by-line path (a record without a kind sends the file there); read as a float
    "run.huge/tokens-below-int64": usable(
        rank1_line(experts(f"[{-(2**63) - 1}]") + '\n{"step": 1}'), 2, "kind"
    ),
    "run.huge/tokens-10**400": usable(rank1_line(experts(f"[{10**400}]")), 2, "numbers"),
    "run.huge/experts-10**6": usable(
        rank1_line(lambda: experts(json.dumps([1] * 10**6))), 2, "tokens"
    ),
    "run.huge/label-1MB": usable(rank1_line(record(phase="x" * 2**20)), 2, "phase is longer than"),
    "run.huge/line-5000-digits": usable(
        rank1_line(f'{{"kind": "step", "step": {"9" * 5000}}}'), 2, "not valid JSON"
    ),
    # step indices
    "run.step/negative": usable(rank1_line(record(step=-1)), 2, "not an integer >= 0"),
    "run.step/2**40": usable(rank1_line(record(step=2**40)), 2, "step", cli=True),
    "run.step/int64-max": usable(rank1_line(step(2**63 - 1)), 2, "step"),
    # deep nesting
    "run.deep/line": usable(rank1_line("[" * 200_000), 2, "nested", cli=True),
    "run.deep/valid-line": usable(rank1_line(deep(200_000)), 2, "nested"),
    "run.deep/event-field": usable(rank1_line(event(deep(200_000))), 2, "nested"),
    "run.deep/event-field-500": usable(rank1_line(event(deep(500))), 2, "nested"),
    # a 60 MB line
    "run.long-line/span": usable(
        rank1_line(lambda: record(phase="x" * LONG_LINE)), 2, "longer than", cli=True
    ),
    "run.long-line/event": usable(
        rank1_line(lambda: event(json.dumps("y" * LONG_LINE))), 2, "longer than"
    ),
}

test_hostile_input, test_hostile_input_through_the_command = family_tests(CASES)
