"""The collectors' Arrow flush (diag/rankfile/arrow_encode.py, the IPC message assembled from its
buffers) writes the bytes pyarrow's own conversion writes (arrow_format.encode_batch), for any
records: typed ones, ones that fit no schema (they travel as JSON in `other`), empty flushes, a
flush seen before (its metadata and labels from the caches)."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.writer import ArrowRankWriter
from diag.rankfile import arrow_encode, arrow_format
from diag.read.load import read_rank_file

T = 1_700_000_000_000_000_000


def _same(records: list[dict[str, Any]]) -> None:
    fast = arrow_encode.encode_flush(records)
    assert fast == arrow_format.encode_batch(records)
    assert arrow_encode.encode_flush(records) == fast  # again, from the caches of shapes
    batch = pa.ipc.read_record_batch(pa.py_buffer(fast), arrow_format.STREAM_SCHEMA)
    batch.validate(full=True)


def test_typical_flushes_are_byte_identical() -> None:
    step = {"kind": "step", "step": 3, "t0": T, "t1": T + 10, "tokens": 256, "loss": 6.5}
    span = {"kind": "span", "step": 3, "mb": 0, "phase": "fwd", "stage": 0, "chunk": 0,
            "t0": T, "t1": T + 4}  # fmt: skip
    comm = {"kind": "comm", "step": 3, "op": "all_reduce", "group": "dp", "group_size": 2,
            "bytes": 4096, "dtype": "float32", "t0": T + 4, "t1": T + 6, "expected_bytes": 4096,
            "tag": "grad", "async": True, "blocking": False, "layer": None, "peer": 1}  # fmt: skip
    mem = {"kind": "mem", "step": 3, "params": 1, "grads": 2, "optimizer": 3,
           "activations": None, "comm_buffers": 0, "fragmentation": None, "device_peak": None,
           "source": "tensors"}  # fmt: skip
    experts = {"kind": "experts", "step": 3, "layer": 1, "tokens": [3, 4.5, 0], "dropped": 0,
               "capacity": 8.0, "aux_loss": 0.01}  # fmt: skip
    event = {"kind": "event", "step": 3, "name": "oom", "breakdown": {"params": 1}, "x": [1]}
    meta = {"kind": "meta", "rank": 0, "pid": 10, "host": "h"}
    _same([])
    _same([meta])
    _same([span, comm, step, mem])
    _same([span] * 9 + [comm] * 5 + [experts, event, meta, step, mem])
    _same([{**span, "mb": None, "stage": None, "chunk": None}, {**comm, "async": None}])
    _same([{**step, "loss": math.nan}, {**step, "loss": math.inf, "tokens": None}])
    _same([{**experts, "tokens": []}, {**experts, "tokens": None}])


def test_misfits_travel_as_json_as_encode_batch_sends_them() -> None:
    step = {"kind": "step", "step": 1, "t0": 1, "t1": 2}
    _same([
        {**step, "t1": 2**63},  # beyond int64
        {**step, "t0": -(2**63)},  # the smallest int64 fits
        {**step, "step": True},  # a bool is no integer
        {**step, "loss": "1.0"},
        {**step, "t0": None},  # not null
        {"kind": "step", "step": 1, "t0": 1},  # a required field missing
        {"kind": 7, "step": 1},
        {"step": 1},
        {"kind": "span", "step": 1, "phase": 3, "t0": 1, "t1": 2},
        {"kind": "experts", "step": 1, "layer": 0, "tokens": [1, "2"]},
        {"kind": "experts", "step": 1, "layer": 0, "tokens": (1, 2)},
        {"kind": "comm", "step": 1, "op": "send", "t0": 1, "t1": 2, "async": 1},
        {"kind": "event", "step": 1, "name": "x", "value": object()},  # JSON via str()
    ])  # fmt: skip


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True),
    st.text(max_size=8), st.lists(st.one_of(st.integers(-5, 5), st.floats(-1, 1)), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip


@st.composite
def _record(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from([*arrow_format.KIND_FIELDS, "meta", None]))
    record: dict[str, Any] = {} if kind is None else {"kind": kind}
    for name, _ in arrow_format.KIND_FIELDS.get(kind or "", ()):
        if draw(st.integers(0, 9)) == 0:
            continue  # absent
        if name in ("step", "t0", "t1") and draw(st.booleans()):
            record[name] = draw(st.integers(0, 2**40))
        else:
            record[name] = draw(_VALUES)
    for name in draw(st.lists(st.sampled_from(["peer", "layer", "extra", "z"]), max_size=2)):
        record[name] = draw(_VALUES)
    return record


@settings(max_examples=300, deadline=None)
@given(st.lists(_record(), max_size=12))
def test_any_records_give_encode_batchs_bytes(records: list[dict[str, Any]]) -> None:
    try:
        expected: bytes | type[Exception] = arrow_format.encode_batch(records)
    except (pa.ArrowException, ValueError, OverflowError) as error:
        expected = type(error)
    if isinstance(expected, bytes):
        assert arrow_encode.encode_flush(records) == expected
    # (a record pyarrow refuses is refused by both; not asserted further)


def test_the_collectors_writer_uses_it_and_reads_back(tmp_path: Any) -> None:
    writer = ArrowRankWriter(tmp_path / "rank-00000.arrows")
    for step in range(3):
        writer.write({"kind": "step", "step": step, "t0": T + step, "t1": T + step + 1})
        writer.flush()
    writer.close()
    part = read_rank_file(0, tmp_path / "rank-00000.arrows")
    assert part.skipped == [] and list(part.columns["step"]["step"]) == [0, 1, 2]
