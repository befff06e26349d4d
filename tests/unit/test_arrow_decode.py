"""`arrow_format.decode` decodes every input as it did before its per-file cost was cut
(tests/unit/arrow_decode_before.py): the same packed columns, JSON lines, notes, NaN-loss count
and fatal verdict, over files written by the simulator and the collectors' writer and over a
hostile corpus (truncations, flipped bytes, records out of bounds, null structs and fields,
multi-row and sliced batches, extension columns and fields, compressed bodies)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.cli.main import main
from diag.rankfile import arrow_format
from diag.rankfile.arrow_format import STREAM_SCHEMA, ArrowRank
from diag.rankfile.rank_file import KEPT_COLUMNS, NUMERIC_COLUMNS
from diag.rankfile.records import Encoded
from tests.unit import arrow_decode_before as before
from tests.unit.test_hostile_arrow import rank_records, stream, write_run

BASE_NS = 1_000_000_000


def assert_same(data: bytes) -> ArrowRank:
    """Today's decode of `data` equals the reference's, field for field."""
    got = arrow_format.decode(data, "r.arrows", KEPT_COLUMNS, NUMERIC_COLUMNS)
    assert_equal_decodes(got, before.decode(data, "r.arrows", KEPT_COLUMNS, NUMERIC_COLUMNS))
    return got


def assert_equal_decodes(got: ArrowRank, want: ArrowRank) -> None:
    """Two decodes of a file equal field for field (NaN equal to NaN)."""
    assert got.fatal == want.fatal
    assert got.skipped == want.skipped
    assert got.nan_loss == want.nan_loss
    assert got.other_lines == want.other_lines
    assert got.columns.keys() == want.columns.keys()
    for kind, table in want.columns.items():
        assert got.columns[kind].keys() == table.keys(), kind
        for name, column in table.items():
            _assert_same_column(got.columns[kind][name], column, f"{kind}.{name}")


def _assert_same_column(got: Any, want: Any, where: str) -> None:
    assert type(got) is type(want), where
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, where
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, Encoded):
        assert _same_values(got.values, want.values), where
        assert got.codes.dtype == want.codes.dtype, where
        np.testing.assert_array_equal(got.codes, want.codes, err_msg=where)
    else:
        assert _same_values(got, want), where


def _same_values(got: list[Any], want: list[Any]) -> bool:
    """Lists equal, NaN equal to NaN (a token count or a label may be NaN)."""
    if len(got) != len(want):
        return False
    return all(_same(a, b) for a, b in zip(got, want, strict=True))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return _same_values(a, b)
    return type(a) is type(b) and a == b


# --- files real writers wrote --------------------------------------------------------------


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """A small 3D run and an MoE run from `diag simulate`, every rank file."""
    out = []
    root = tmp_path_factory.mktemp("sim")
    for name, args in (
        ("3d", ["--layout", "dp=2,tp=2,pp=2", "--microbatches", "4", "--steps", "3"]),
        ("moe", ["--layout", "dp=2,ep=2", "--experts", "4", "--steps", "2"]),
    ):
        run = root / name
        result = CliRunner().invoke(main, ["simulate", *args, "--out", str(run)])
        assert result.exit_code == 0, result.output
        out += [path.read_bytes() for path in sorted(run.glob("rank-*.arrows"))]
    assert out
    return out


def test_simulated_rank_files_decode_as_before(simulated: list[bytes]) -> None:
    for data in simulated:
        assert_same(data)


def test_the_writers_rank_files_decode_as_before(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    for path in sorted(run.glob("rank-*.arrows")):
        decoded = assert_same(path.read_bytes())
        assert len(decoded.columns["step"]["step"]) == 3


def test_an_empty_stream_decodes_as_before() -> None:
    assert_same(arrow_format.stream_header())
    assert_same(arrow_format.stream_header() + arrow_format.END_OF_STREAM)
    assert_same(b"")
    assert_same(bytes(range(256)))


# --- hostile input ---------------------------------------------------------------------------


def test_every_truncation_decodes_as_before(simulated: list[bytes]) -> None:
    data = simulated[0]
    for cut in range(0, len(data), max(1, len(data) // 150)):
        assert_same(data[:cut])


def test_flipped_bytes_decode_as_before(simulated: list[bytes]) -> None:
    data = simulated[-1]
    for at in range(0, len(data), max(1, len(data) // 150)):
        flipped = bytearray(data)
        flipped[at] ^= 0xA5
        assert_same(bytes(flipped))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_bytes_decode_as_before(data: st.DataObject) -> None:
    good = _good_file()
    forged = bytearray(good)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(forged) - 1))
        forged[at] = data.draw(st.integers(0, 255))
    assert_same(bytes(forged))


def test_records_out_of_bounds_decode_as_before() -> None:
    bad = [
        {"kind": "step", "step": -1, "t0": 1, "t1": 2, "loss": float("nan")},
        {"kind": "step", "step": 2**41, "t0": 1, "t1": 2},
        {"kind": "step", "step": 3, "t0": 1, "t1": 2, "loss": float("nan"), "tokens": None},
        {"kind": "span", "step": 0, "phase": "fwd", "t0": 5, "t1": 2},
        {"kind": "span", "step": 0, "phase": "x" * 2000, "t0": 1, "t1": 2},
        {"kind": "span", "step": 0, "phase": "é" * 600, "t0": 1, "t1": 2},  # 1,200 bytes
        {"kind": "span", "step": 0, "phase": "fwd", "mb": 2**30, "t0": 1, "t1": 2},
        {"kind": "span", "step": 0, "phase": None, "mb": -1, "t0": 1, "t1": 2},
        {"kind": "comm", "step": 0, "op": "send", "group": "pp", "group_size": 2,
         "bytes": 1, "t0": 2**62 + 5, "t1": 2**62 + 6},
        {"kind": "comm", "step": 0, "op": "send", "t0": -(2**63), "t1": 0},
        {"kind": "experts", "step": 0, "layer": 0, "tokens": [1.0] * (2**16 + 1)},
        {"kind": "experts", "step": 0, "layer": 0, "tokens": [float("nan")]},
        {"kind": "experts", "step": 0, "layer": 1, "tokens": [1.0, 2.0], "dropped": 1},
        {"kind": "event", "step": 0, "name": "deep", "x": _nested(80)},
        {"kind": "event", "step": 0, "name": "ok", "x": 1},
        {"kind": "mem", "step": 0, "params": 1.5, "source": "allocator"},
        {"kind": "span", "step": 0, "phase": 7, "t0": 1, "t1": 2},
        {"kind": "custom", "step": 0, "what": [1, 2]},
    ]  # fmt: skip
    data = arrow_format.stream_header() + arrow_format.encode_batch(bad)
    for step in rank_records(1):
        data += arrow_format.encode_batch(step)
    assert_same(data)


def test_more_reasons_than_notes_decode_as_before() -> None:
    long = "x" * 1100
    bad = [{"kind": "span", "step": 0, "phase": "p", "mb": 2**30 + i, "stage": -1, "chunk": -1,
            "t0": 2, "t1": 1} for i in range(3)]  # fmt: skip
    bad += [{"kind": "comm", "step": -1, "op": long, "group": long, "group_size": 2, "bytes": 1,
             "t0": -(2**63), "t1": 2, "tag": long, "dtype": long}]  # fmt: skip
    bad += [{"kind": "comm", "step": 0, "op": "a", "group": "g", "group_size": 2, "bytes": 1,
             "t0": 1, "t1": 2, name: long} for name in ("op", "group", "tag", "dtype")]  # fmt: skip
    bad += [{"kind": "mem", "step": 0, "source": long}, {"kind": "event", "step": 0, "name": long}]
    bad += [{"kind": "step", "step": step, "t0": 1, "t1": 2} for step in (-1, 2**41)]
    bad += [{"kind": kind, "step": step, "t0": 1, "t1": 2, "phase": "p", "op": "o", "group": "g",
             "group_size": 1, "bytes": 1, "name": "e"}
            for kind in ("span", "comm", "mem", "event") for step in (-1, 2**41)]  # fmt: skip
    bad += [{"kind": "span", "step": 0, "phase": long if name == "phase" else "p", name: 2**30,
             "t0": 1, "t1": 2} for name in ("phase", "mb", "stage", "chunk")]  # fmt: skip
    decoded = assert_same(arrow_format.stream_header() + arrow_format.encode_batch(bad))
    assert any("other reasons" in note for note in decoded.skipped), decoded.skipped


def test_null_records_and_fields_decode_as_before() -> None:
    """Batches no writer makes: null structs, null lists, null steps and times, several rows
    to a batch, lists sliced so their offsets do not start at 0."""
    step_type = arrow_format.kind_type("step")
    steps = [
        {"step": 0, "t0": 1, "t1": 2, "tokens": 1.0, "loss": 1.0, "extra": None},
        None,
        {"step": None, "t0": None, "t1": 2, "tokens": None, "loss": None, "extra": None},
        {"step": 1, "t0": 3, "t1": None, "tokens": 2.0, "loss": float("nan"), "extra": "{}"},
    ]
    span = {"step": 0, "phase": "fwd", "mb": None, "stage": 1, "chunk": None, "t0": 1, "t1": 2,
            "extra": None}  # fmt: skip
    columns = []
    for f in STREAM_SCHEMA:
        if f.name == "step":
            columns.append(pa.array([steps[:2], None, steps[2:]], f.type))
        elif f.name == "span":
            columns.append(pa.array([[span], [span, None], None], f.type))
        elif f.name == "other":
            columns.append(pa.array([['{"kind":"step"}'], None, [None, "{}"]], f.type))
        else:
            columns.append(pa.array([[], [], None], f.type))
    batch = pa.RecordBatch.from_arrays(columns, schema=STREAM_SCHEMA)
    assert step_type == batch.schema.field("step").type.value_type
    assert_same(stream(STREAM_SCHEMA, [batch, batch.slice(1), batch.slice(2, 1)]))


def test_extension_columns_and_fields_decode_as_before() -> None:
    """The format grows by extension: a column and struct fields it does not name, some named
    like another kind's typed fields (they are not checked)."""
    grown = {
        "step": [pa.field("new", pa.string()), pa.field("phase", pa.string())],
        "mem": [pa.field("t0", pa.string()), pa.field("mb", pa.int64())],
    }
    fields = [
        pa.field(f.name, pa.list_(pa.struct([*arrow_format.kind_type(f.name), *grown[f.name]])))
        if f.name in grown
        else f
        for f in STREAM_SCHEMA
    ]
    schema = pa.schema([*fields, pa.field("later", pa.int64())], metadata=STREAM_SCHEMA.metadata)
    rows = {
        "step": {"step": 0, "t0": 1, "t1": 2, "loss": 2.0, "new": "x", "phase": "p" * 2000},
        "mem": {"step": 0, "params": 1.0, "t0": "later", "mb": -5},
    }
    columns = [pa.array([[rows[f.name]]] if f.name in rows else [[]], f.type) for f in fields]
    batch = pa.RecordBatch.from_arrays([*columns, pa.array([7])], schema=schema)
    decoded = assert_same(stream(schema, [batch, batch]))
    assert len(decoded.columns["step"]["step"]) == len(decoded.columns["mem"]["step"]) == 2
    assert decoded.skipped == []


def test_compressed_and_forged_batches_decode_as_before() -> None:
    good = _good_file()
    header = len(arrow_format.stream_header())
    batch = pa.ipc.read_record_batch(pa.py_buffer(good[header:]), STREAM_SCHEMA)
    assert_same(stream(STREAM_SCHEMA, [batch], compression="lz4"))
    assert_same(good + good[header:])  # a second stream's batches, appended
    assert_same(good[:header] + good)  # a schema message where a batch belongs


def _good_file() -> bytes:
    data = arrow_format.stream_header()
    for step in rank_records(0, steps=2):
        data += arrow_format.encode_batch(step)
    return data + arrow_format.END_OF_STREAM


def _nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value
