"""Hostile Arrow rank files (`rank-NNNNN.arrows`, diag/rankfile/arrow_format.py) never crash the
reader.

Each case writes a valid 2-rank Arrow run with the collectors' writer and breaks rank 1's file:
truncated anywhere, corrupt bytes, a stream of another schema, a compressed or dictionary batch, a
message that declares a huge body, records beyond the bounds of diag/contract/limits.py. The
contract is the JSONL reader's (tests/unit/test_hostile_input.py): exit 0 with the good ranks
analysed and a note in `skipped`, or one line `diag: error: PATH: reason`; never a traceback.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.writer import open_rank_writer
from diag.cli.main import main
from diag.rankfile import arrow_format
from diag.read.load import read_rank_file
from tests.conftest import RunWriter

BASE_NS = 1_000_000_000


def rank_records(rank: int, steps: int = 3) -> list[list[dict[str, Any]]]:
    """A rank's records, one list a step: fwd, bwd, an all-reduce, memory, the step."""
    out = []
    for step in range(steps):
        t = BASE_NS + step * 1000
        out.append([
            {"kind": "span", "step": step, "mb": None, "phase": "fwd", "stage": None,
             "chunk": None, "t0": t, "t1": t + 300},
            {"kind": "span", "step": step, "mb": None, "phase": "bwd", "stage": None,
             "chunk": None, "t0": t + 300, "t1": t + 700},
            {"kind": "comm", "step": step, "op": "all_reduce", "group": "dp", "group_size": 2,
             "bytes": 4096, "dtype": "float32", "t0": t + 700 + rank, "t1": t + 900,
             "expected_bytes": 4096, "tag": "ddp", "async": False, "blocking": True},
            {"kind": "mem", "step": step, "params": 100, "grads": 100, "optimizer": 200,
             "activations": 50, "comm_buffers": 10, "fragmentation": None},
            {"kind": "step", "step": step, "t0": t, "t1": t + 1000, "tokens": 64, "loss": 2.0},
        ])  # fmt: skip
    return out


def write_run(root: Path, world: int = 2, format: str = "arrow") -> Path:
    run = root / "run"
    run.mkdir(parents=True)
    manifest = RunWriter.manifest(world)
    (run / "manifest.json").write_text(json.dumps(manifest))
    for rank in range(world):
        writer = open_rank_writer(run, rank, format)  # type: ignore[arg-type]
        writer.write({"kind": "meta", "step": None, "rank": rank})
        for step in rank_records(rank):
            for record in step:
                writer.write(record)
            writer.flush()
        writer.close()
    return run


def analyze(run: Path) -> tuple[int, dict[str, Any] | None, str]:
    result = CliRunner().invoke(main, ["analyze", str(run), "--format", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    if result.exit_code == 0:
        return 0, json.loads(result.stdout), result.stderr
    return result.exit_code, None, result.stderr


def good_bytes(tmp_path: Path) -> bytes:
    return (write_run(tmp_path / "good") / "rank-00001.arrows").read_bytes()


def with_rank1(tmp_path: Path, data: bytes) -> Path:
    run = write_run(tmp_path / "case")
    (run / "rank-00001.arrows").write_bytes(data)
    return run


def assert_usable(run: Path, note: str | None, ranks: int = 2) -> dict[str, Any]:
    code, report, err = analyze(run)
    assert code == 0, err
    assert report is not None
    assert len(report["ranks"]) == ranks
    if note is not None:
        assert any(note in line for line in report["skipped"]), report["skipped"]
    return report


def stream(schema: pa.Schema, batches: list[pa.RecordBatch], **options: Any) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def typed_batch(records: list[dict[str, Any]]) -> bytes:
    """The encapsulated message of one batch, bypassing the writer's own checks by design
    (the writer sends misfit records to JSON; hostile files need not)."""
    return arrow_format.encode_batch(records)


# --- the format itself ---------------------------------------------------------------------


def test_arrow_run_reads_like_its_jsonl_twin(tmp_path: Path) -> None:
    arrow = assert_usable(write_run(tmp_path / "a"), None)
    jsonl = assert_usable(write_run(tmp_path / "j", format="jsonl"), None)
    assert arrow == jsonl
    assert arrow["skipped"] == []


def test_every_truncation_keeps_the_complete_batches(tmp_path: Path) -> None:
    """Cut at 80 places through the file and around the schema's end: never a traceback; a
    cut inside the schema makes the rank unusable (noted), a cut after it keeps each batch
    that is whole."""
    data = good_bytes(tmp_path)
    header = len(arrow_format.stream_header())
    cuts = {*range(0, len(data), max(1, len(data) // 80)), header - 1, header, header + 1}
    for cut in sorted(cuts):
        part = read_rank_file(1, _write(tmp_path / "cut.arrows", data[:cut]))
        steps = len(part.columns["step"]["step"]) if part.columns else 0
        assert steps <= 3
        if cut < header:
            assert steps == 0 and part.skipped, cut
        elif cut < len(data) - len(arrow_format.END_OF_STREAM):
            message_cut = steps < 3
            assert not message_cut or part.skipped or cut == header, (cut, part.skipped)


def test_truncated_mid_batch_says_so(tmp_path: Path) -> None:
    data = good_bytes(tmp_path)
    part = read_rank_file(1, _write(tmp_path / "cut.arrows", data[: len(data) - 200]))
    assert len(part.columns["step"]["step"]) == 2  # the first two steps' batches are whole
    assert_usable(with_rank1(tmp_path, data[: len(data) - 200]), "2 complete batches kept")


@pytest.mark.parametrize(
    ("name", "build", "note"),
    [
        ("garbage", lambda good: bytes(range(256)) * 40, "not an Arrow"),
        ("zeros", lambda good: b"\x00" * 4096, "rank 1 not analysed"),
        ("empty-stream", lambda good: arrow_format.END_OF_STREAM, "rank 1 not analysed"),
        ("jsonl-inside", lambda good: b'{"kind":"step","step":0,"t0":1,"t1":2}\n', "not"),
        (
            "other-schema",
            lambda good: stream(pa.schema([("x", pa.int64())]), []),
            "not a diag Arrow rank file",
        ),
        (
            "right-tag-wrong-types",
            lambda good: stream(
                pa.schema(
                    [("step", pa.list_(pa.struct([("step", pa.string())])))],
                    metadata={arrow_format.FORMAT_KEY: arrow_format.FORMAT_VALUE},
                ),
                [],
            ),
            "wrong schema",
        ),
        ("flipped-body", lambda good: _flip(good, len(good) // 2), None),
        ("flipped-header", lambda good: _flip(good, 40), None),
    ],
)
def test_corrupt_files_are_skipped_with_a_note(
    tmp_path: Path, name: str, build: Any, note: str | None
) -> None:
    data = build(good_bytes(tmp_path))
    part = read_rank_file(1, _write(tmp_path / f"{name}.arrows", data))
    if note is not None:
        assert any(note in line for line in part.skipped), part.skipped
    assert len(part.columns["step"]["step"]) <= 3


def test_a_corrupt_rank_file_leaves_the_others_analysed(tmp_path: Path) -> None:
    assert_usable(with_rank1(tmp_path, bytes(range(256)) * 40), "not an Arrow", ranks=1)


def test_compressed_batches_are_refused(tmp_path: Path) -> None:
    """LZ4 bodies declare their inflated size: a few bytes could ask for gigabytes."""
    batch = pa.ipc.read_record_batch(
        pa.py_buffer(typed_batch(rank_records(1)[0])), arrow_format.STREAM_SCHEMA
    )
    data = stream(arrow_format.STREAM_SCHEMA, [batch], compression="lz4")
    part = read_rank_file(1, _write(tmp_path / "lz4.arrows", data))
    assert any("compressed" in line for line in part.skipped), part.skipped
    assert len(part.columns["step"]["step"]) == 0


def test_a_message_declaring_a_huge_body_allocates_nothing(tmp_path: Path) -> None:
    """The body length field of the first batch set to 2**40: read from the file's bytes,
    the message is short and refused, not allocated."""
    good = good_bytes(tmp_path)
    header = len(arrow_format.stream_header())
    message = pa.ipc.read_message(pa.py_buffer(good[header:]))
    # an encapsulated message: 0xFFFFFFFF, metadata length, flatbuffer metadata, body
    metadata = message.metadata.to_pybytes()
    at = good.index(metadata, header)
    length_field = _body_length_offset(metadata)
    forged = bytearray(good)
    struct.pack_into("<q", forged, at + length_field, 2**40)
    part = read_rank_file(1, _write(tmp_path / "huge.arrows", bytes(forged)))
    assert any("batch" in line for line in part.skipped), part.skipped
    assert len(part.columns["step"]["step"]) == 0
    assert_usable(with_rank1(tmp_path, bytes(forged)), "batch", ranks=1)


def test_out_of_bounds_records_are_skipped_by_reason(tmp_path: Path) -> None:
    bad = [
        {"kind": "step", "step": -1, "t0": 1, "t1": 2},
        {"kind": "step", "step": 2**41, "t0": 1, "t1": 2},
        {"kind": "span", "step": 0, "phase": "fwd", "t0": 5, "t1": 2},
        {"kind": "span", "step": 0, "phase": "x" * 2000, "t0": 1, "t1": 2},
        {"kind": "span", "step": 0, "phase": "fwd", "mb": 2**30, "t0": 1, "t1": 2},
        {"kind": "comm", "step": 0, "op": "send", "group": "pp", "group_size": 2,
         "bytes": 1, "t0": 2**62 + 5, "t1": 2**62 + 6},
        {"kind": "experts", "step": 0, "layer": 0, "tokens": [1.0] * (2**16 + 1)},
        {"kind": "experts", "step": 0, "layer": 0, "tokens": [float("nan")]},
        {"kind": "event", "step": 0, "name": "deep", "x": _nested(80)},
    ]  # fmt: skip
    data = arrow_format.stream_header() + typed_batch(bad)
    for step in rank_records(1):
        data += typed_batch(step)
    part = read_rank_file(1, _write(tmp_path / "bounds.arrows", data))
    notes = "\n".join(part.skipped)
    for reason in ("negative step", "beyond the limit of 2**40", "t1 before t0",
                   "longer than 1024", "mb is not an integer", "beyond ±2**62",
                   "more than 65536", "not a list of numbers", "levels"):  # fmt: skip
        assert reason in notes, (reason, notes)
    assert len(part.columns["step"]["step"]) == 3  # the good steps all kept
    assert_usable(with_rank1(tmp_path, data), "t1 before t0")


def test_misfit_records_travel_as_json_and_are_checked(tmp_path: Path) -> None:
    """A label that is an integer, an unknown kind: JSON lines in `other`, read by the JSONL
    path (an int label is fine there; a string step is not)."""
    records = [
        {"kind": "span", "step": 0, "phase": 7, "t0": 1, "t1": 2},
        {"kind": "span", "step": "zero", "phase": "fwd", "t0": 1, "t1": 2},
        {"kind": "custom", "step": 0, "what": [1, 2]},
    ]
    data = arrow_format.stream_header() + typed_batch(records)
    part = read_rank_file(1, _write(tmp_path / "misfit.arrows", data))
    assert list(part.columns["span"]["phase"]) == [7] or 7 in list(_labels(part))
    assert any("not an integer" in note for note in part.skipped), part.skipped


def test_every_rank_unusable_is_one_line(tmp_path: Path) -> None:
    run = write_run(tmp_path / "bad")
    for rank in (0, 1):
        (run / f"rank-{rank:05d}.arrows").write_bytes(b"\xff\xff\xff\xff" + b"\x7f" * 64)
    result = CliRunner().invoke(main, ["analyze", str(run)])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code != 0:
        assert result.exit_code == 2
        assert result.stderr.startswith("diag: error: ") and result.stderr.count("\n") == 1


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_fuzzed_bytes_never_raise(tmp_path: Path, data: st.DataObject) -> None:
    good = _good_cache(tmp_path)
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(good) - 1), st.integers(0, 255)),
                               min_size=1, max_size=8))  # fmt: skip
    cut = data.draw(st.integers(0, len(good)))
    mutated = bytearray(good[:cut] if cut else good)
    for at, value in edits:
        if at < len(mutated):
            mutated[at] = value
    part = read_rank_file(1, _write(tmp_path / "fuzz.arrows", bytes(mutated)))
    assert len(part.columns["step"]["step"]) <= 3


# --- helpers --------------------------------------------------------------------------------------
_GOOD: dict[str, bytes] = {}


def _good_cache(tmp_path: Path) -> bytes:
    if "good" not in _GOOD:
        _GOOD["good"] = good_bytes(tmp_path / "fuzz-source")
    return _GOOD["good"]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    for i in range(at, min(at + 16, len(out))):
        out[i] ^= 0xA5
    return bytes(out)


def _nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def _labels(part: Any) -> list[Any]:
    column = part.columns["span"]["phase"]
    if hasattr(column, "codes"):
        return [column.values[c] for c in column.codes.tolist()]
    return list(column)


def _body_length_offset(metadata: bytes) -> int:
    """Where Message.bodyLength (field 3, an int64) sits in the flatbuffer metadata."""
    root = struct.unpack_from("<I", metadata, 0)[0]
    vtable = root - struct.unpack_from("<i", metadata, root)[0]
    offset = struct.unpack_from("<H", metadata, vtable + 4 + 2 * 3)[0]
    assert offset, "the writer always stores a body length"
    return root + offset
