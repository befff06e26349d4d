"""The compiled fast path of Arrow rank files (diag/rankfile/arrow_fast.py) decodes what it takes
exactly as pyarrow's path does (`arrow_format.decode`), takes every file the writers write, and on
hostile input (truncations, forged numbers in the metadata, flipped bytes, batches no writer makes)
either gives pyarrow's output or declines, never raising or reading out of bounds."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.cli.main import main
from diag.rankfile import arrow_fast, arrow_format
from diag.rankfile.arrow_format import STREAM_SCHEMA, ArrowRank
from diag.rankfile.arrow_layout import BUFFER_COUNT, NODES, TEMPLATE
from diag.rankfile.rank_file import KEPT_COLUMNS, NUMERIC_COLUMNS
from tests.unit.test_arrow_decode import assert_equal_decodes
from tests.unit.test_hostile_arrow import rank_records, stream, write_run

HEADER = arrow_format.stream_header()


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    arrow_fast.prepare()


def fast_or_none(data: bytes) -> ArrowRank | None:
    """The fast path's decode, None when it declines; it must never raise."""
    buffers = arrow_fast._concatenated(data)  # raises if a check let a bad position through
    if buffers is not None:  # and so does making any array of the buffers
        for column in STREAM_SCHEMA.names:
            buffers.column(column)
        for kind, name in arrow_fast._FIELD_NODES:
            buffers.field(kind, name)
            buffers.encoded(kind, name)
    return arrow_fast.decode_fast(data, "r.arrows", KEPT_COLUMNS, NUMERIC_COLUMNS)


def assert_same_as_pyarrow(data: bytes) -> bool:
    """When the fast path takes `data`, its decode equals pyarrow's path's, field for field;
    whether it took it."""
    got = fast_or_none(data)
    if got is None:
        return False
    assert_equal_decodes(got, arrow_format.decode(data, "r.arrows", KEPT_COLUMNS, NUMERIC_COLUMNS))
    return True


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """Rank files of `diag simulate` runs of every parallelism (3D, interleaved, MoE with
    expert loads, ZeRO-3)."""
    out = []
    root = tmp_path_factory.mktemp("sim")
    for name, args in (
        ("3d", ["--layout", "dp=2,tp=2,pp=2", "--microbatches", "4", "--steps", "3"]),
        (
            "interleaved",
            [
                "--layout",
                "pp=2",
                "--schedule",
                "interleaved",
                "--virtual-stages=2",
                "--microbatches=4",
                "--steps=2",
            ],
        ),
        ("moe", ["--layout", "dp=2,ep=2", "--experts", "4", "--steps", "2"]),
        ("zero3", ["--layout", "dp=2", "--zero-stage", "3", "--steps", "2"]),
        ("straggler", ["--layout=dp=2,pp=2", "--inject=straggler:rank=1,ms=20", "--steps=2"]),
    ):
        run = root / name
        result = CliRunner().invoke(main, ["simulate", *args, "--out", str(run)])
        assert result.exit_code == 0, (name, result.output)
        out += [path.read_bytes() for path in sorted(run.glob("rank-*.arrows"))]
    return out


def test_the_simulators_files_take_the_fast_path_and_decode_alike(simulated: list[bytes]) -> None:
    for data in simulated:
        assert assert_same_as_pyarrow(data)


def test_the_collectors_files_take_the_fast_path_and_decode_alike(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    for path in sorted(run.glob("rank-*.arrows")):
        assert assert_same_as_pyarrow(path.read_bytes())


def test_the_arrays_are_valid_arrow(simulated: list[bytes]) -> None:
    for data in simulated[:4]:
        buffers = arrow_fast._concatenated(data)
        assert buffers is not None
        for column in buffers.lists().values():
            column.validate(full=True)


def test_records_the_checks_reject_decode_alike() -> None:
    """Typed records out of bounds travel the fast path; the checks after it reject them as
    on pyarrow's path (with the same notes)."""
    bad = [
        {"kind": "step", "step": -1, "t0": 1, "t1": 2, "loss": float("nan")},
        {"kind": "step", "step": 2**41, "t0": 1, "t1": 2},
        {"kind": "span", "step": 0, "phase": "fwd", "t0": 5, "t1": 2},
        {"kind": "span", "step": 0, "phase": "x" * 2000, "t0": 1, "t1": 2},
        {"kind": "span", "step": 0, "phase": None, "mb": -1, "t0": 1, "t1": 2},
        {"kind": "comm", "step": 0, "op": "send", "t0": -(2**63), "t1": 0},
        {"kind": "experts", "step": 0, "layer": 0, "tokens": [1.0] * (2**16 + 1)},
        {"kind": "experts", "step": 0, "layer": 0, "tokens": [float("nan")]},
        {"kind": "event", "step": 0, "name": "ok", "x": 1},
        {"kind": "event", "step": 0, "name": "not an object", "x": [[[[[[0]]]]]]},
        {"kind": "span", "step": 0, "phase": 7, "t0": 1, "t1": 2},
        {"kind": "custom", "step": 0, "what": [1, 2]},
    ]  # fmt: skip
    data = HEADER + arrow_format.encode_batch(bad)
    for step in rank_records(1):
        data += arrow_format.encode_batch(step)
    assert assert_same_as_pyarrow(data)
    decoded = fast_or_none(data)
    assert decoded is not None and decoded.skipped


def test_it_declines_what_it_does_not_take(simulated: list[bytes]) -> None:
    """A non-ASCII label, a truncated file (a killed rank), no batch, a file of another
    schema or with batches no writer makes: pyarrow's path reads them."""
    good = simulated[0]
    utf8 = [{"kind": "span", "step": 0, "phase": "é", "t0": 1, "t1": 2}]
    assert fast_or_none(HEADER + arrow_format.encode_batch(utf8)) is None
    assert fast_or_none(good[:-13]) is None
    assert fast_or_none(HEADER) is None
    assert fast_or_none(HEADER + arrow_format.END_OF_STREAM) is None
    batch = pa.ipc.read_record_batch(pa.py_buffer(good[len(HEADER) :]), STREAM_SCHEMA)
    assert fast_or_none(stream(STREAM_SCHEMA, [batch], compression="lz4")) is None
    two_rows = pa.RecordBatch.from_arrays(
        [pa.concat_arrays([batch.column(i), batch.column(i)]) for i in range(batch.num_columns)],
        schema=STREAM_SCHEMA,
    )
    assert fast_or_none(stream(STREAM_SCHEMA, [two_rows])) is None


def test_the_end_of_stream_marker_ends_it(simulated: list[bytes]) -> None:
    good = simulated[1]
    assert good.endswith(arrow_format.END_OF_STREAM)
    assert assert_same_as_pyarrow(good + b"\x00" * 64)  # what follows the marker: unread
    assert assert_same_as_pyarrow(good[: -len(arrow_format.END_OF_STREAM)])  # killed between


def test_every_truncation_decodes_alike_or_is_declined(simulated: list[bytes]) -> None:
    data = simulated[2]
    for cut in range(0, len(data), max(1, len(data) // 300)):
        assert_same_as_pyarrow(data[:cut])


def _number_positions(data: bytes) -> list[int]:
    """The file positions of every number of every batch's metadata (node lengths and null
    counts, buffer offsets and lengths, body lengths): where forged numbers go."""
    positions = []
    at = len(HEADER)
    size = 8 * len(TEMPLATE.message)
    while at + size <= len(data) and data[at : at + 4] == b"\xff\xff\xff\xff":
        if struct.unpack_from("<i", data, at + 4)[0] == 0:
            break
        positions.append(at + TEMPLATE.body_at)
        positions += [at + TEMPLATE.nodes_at + 8 * i for i in range(2 * len(NODES))]
        positions += [at + TEMPLATE.buffers_at + 8 * i for i in range(2 * BUFFER_COUNT)]
        at += size + struct.unpack_from("<q", data, at + TEMPLATE.body_at)[0]
    return positions


_FORGED = st.sampled_from([0, 1, 7, 8, 9, -1, -8, 2**31 - 1, 2**31, 2**32, 2**62, -(2**63)])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_forged_numbers_decode_alike_or_are_declined(data: st.DataObject) -> None:
    """Every number the metadata declares is checked before use: forged to anything, the
    file decodes as pyarrow decodes it, or is declined."""
    good = _good_file(data.draw(st.sampled_from(["moe", "plain"])))
    positions = _number_positions(good)
    forged = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.sampled_from(positions))
        value = data.draw(_FORGED | st.integers(-(2**63), 2**63 - 1))
        if data.draw(st.booleans()):
            value += struct.unpack_from("<q", good, at)[0]  # near the true value
            value = (value + 2**63) % 2**64 - 2**63
        struct.pack_into("<q", forged, at, value)
    assert_same_as_pyarrow(bytes(forged))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_flipped_bytes_decode_alike_or_are_declined(data: st.DataObject) -> None:
    good = _good_file(data.draw(st.sampled_from(["moe", "plain"])))
    forged = bytearray(good)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(forged) - 1))
        forged[at] = data.draw(st.integers(0, 255))
    assert_same_as_pyarrow(bytes(forged))


def test_a_large_run_is_read_through_the_fast_path(tmp_path: Path) -> None:
    """The loader takes the fast path once `prepare` ran, for files of FAST_FROM_BYTES."""
    data = _good_file("plain")
    while len(data) < arrow_fast.FAST_FROM_BYTES:
        data = data[: -len(arrow_format.END_OF_STREAM)] + data[len(HEADER) :]
    got = arrow_fast.decode(data, "r.arrows", KEPT_COLUMNS, NUMERIC_COLUMNS)
    want = arrow_format.decode(data, "r.arrows", KEPT_COLUMNS, NUMERIC_COLUMNS)
    assert fast_or_none(data) is not None
    np.testing.assert_array_equal(got.columns["span"]["t0"], want.columns["span"]["t0"])


def _good_file(shape: str) -> bytes:
    """A small rank file as the collectors' writer makes it: typed records with nulls, labels,
    events, expert loads (`moe`) and a record that travels as JSON."""
    data = HEADER
    for step in rank_records(0, steps=3):
        if shape == "moe":
            step = [*step, {"kind": "experts", "step": step[0]["step"], "layer": 0,
                            "tokens": [3.0, 1.0, None if step[0]["step"] else 2.0],
                            "dropped": None}]  # fmt: skip
        data += arrow_format.encode_batch(step)
    return data + arrow_format.END_OF_STREAM


_LABEL = st.one_of(st.none(), st.sampled_from(["fwd", "bwd", "", "all_reduce", "tp"]),
                   st.text("abc", max_size=4))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_LABEL, max_size=12), min_size=1, max_size=8),
       st.booleans(), st.sampled_from(["string", "int", "bool"]))  # fmt: skip
def test_labels_encode_as_pyarrow_encodes_them(
    batches: list[list[str | None]], repeat: bool, layout: str
) -> None:
    """The compiled dictionary encoding (diag/rankfile/arrow_codes.py) gives pyarrow's codes and
    dictionary, null included, whether batches repeat the one before (`repeat`) or not."""
    from diag.rankfile import arrow_codes

    if repeat:
        batches = [batches[0]] * len(batches) + batches[1:]
    rows = [value for batch in batches for value in batch]
    if layout == "int":
        values: list[object] = [None if v is None else len(v) * 7 - 3 for v in rows]
        array = pa.array(values, pa.int64())
    elif layout == "bool":
        values = [None if v is None else len(v) % 2 == 0 for v in rows]
        array = pa.array(values, pa.bool_())
    else:
        values = list(rows)
        array = pa.array(values, pa.string())
    validity, *rest = array.buffers()
    bitmap = np.zeros(0, np.uint8) if not array.null_count else np.frombuffer(validity, np.uint8)
    offsets = np.zeros(0, np.int32)
    if layout == "string":
        offsets = np.frombuffer(rest[0], np.int32)[: len(rows) + 1].copy()
        data, width = np.frombuffer(rest[1] or b"", np.uint8).copy(), 0
    elif layout == "int":
        data, width = np.frombuffer(rest[0], np.uint8)[: 8 * len(rows)].copy(), 8
    else:
        bits = np.frombuffer(rest[0], np.uint8)
        data, width = np.unpackbits(bits, bitorder="little")[: len(rows)].copy(), 1
    starts = np.cumsum([0] + [len(batch) for batch in batches]).astype(np.int32)
    codes, firsts = arrow_codes.encode(data, offsets, width, bitmap, starts)
    want = array.dictionary_encode(null_encoding="encode")
    np.testing.assert_array_equal(codes, want.indices.to_numpy(zero_copy_only=False))
    assert [values[row] for row in firsts] == want.dictionary.to_pylist()


def test_many_distinct_labels_encode_as_pyarrow_encodes_them() -> None:
    """More distinct values than the first hash table holds (it grows)."""
    from diag.rankfile import arrow_codes

    values = [f"label-{i % 300}" for i in range(2000)] + [None]
    array = pa.array(values)
    offsets = np.frombuffer(array.buffers()[1], np.int32)[: len(values) + 1].copy()
    data = np.frombuffer(array.buffers()[2], np.uint8).copy()
    bitmap = np.frombuffer(array.buffers()[0], np.uint8).copy()
    starts = np.array([0, 1000, len(values)], np.int32)
    codes, firsts = arrow_codes.encode(data, offsets, 0, bitmap, starts)
    want = array.dictionary_encode(null_encoding="encode")
    np.testing.assert_array_equal(codes, want.indices.to_numpy())
    assert [values[row] for row in firsts] == want.dictionary.to_pylist()


def test_kinds_without_rejected_records_are_packed_from_the_buffers(
    simulated: list[bytes],
) -> None:
    """The simulator's steps, spans, collectives and memory records skip pyarrow's arrays
    (diag/rankfile/arrow_fast.py, `packed_kind`); a kind with a rejected record does not."""
    from diag.rankfile import arrow_fast

    buffers = arrow_fast._concatenated(simulated[0])
    assert buffers is not None
    for kind in ("step", "span", "comm", "mem"):
        assert arrow_fast.packed_kind(
            buffers, kind, KEPT_COLUMNS[kind], NUMERIC_COLUMNS.get(kind, ())
        )
    bad = [{"kind": "span", "step": 0, "phase": "fwd", "mb": -1, "t0": 1, "t1": 2}]
    buffers = arrow_fast._concatenated(HEADER + arrow_format.encode_batch(bad))
    assert buffers is not None
    assert arrow_fast.packed_kind(buffers, "span", KEPT_COLUMNS["span"], ()) is None
    assert assert_same_as_pyarrow(HEADER + arrow_format.encode_batch(bad))
