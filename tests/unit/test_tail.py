"""Growing Arrow rank files read a poll at a time (diag/rankfile/tail.py, `diag.RunTail`): only the
record batches appended since the last read, a message still being written left for the next read
(never a note), and the full reader's limits on what is complete: a corrupt, compressed or oversized
message ends the reading of that file with a note, the batches before it kept."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from diag.api import diagnose
from diag.rankfile import arrow_format, tail
from diag.rankfile.convert import convert_run
from diag.rankfile.tail import ArrowTail, open_tail
from diag.read.growing import RunTail
from tests.unit.test_hostile_arrow import _body_length_offset, rank_records, stream, write_run

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden-runs"


def _steps(records: list[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in records if r.get("kind") == "step"]


def _growing(path: Path) -> tuple[bytes, list[bytes]]:
    """The schema message and the batch messages of a 3-step rank file, for appending."""
    header = arrow_format.stream_header()
    path.write_bytes(header)
    return header, [arrow_format.encode_batch(step) for step in rank_records(0)]


def test_batches_are_read_once_as_they_are_appended(tmp_path: Path) -> None:
    path = tmp_path / "rank-00000.arrows"
    _, batches = _growing(path)
    reader = ArrowTail(path)
    assert reader.read_new() == []
    for step, message in enumerate(batches):
        with path.open("ab") as fh:
            fh.write(message)
        new = reader.read_new()
        assert _steps(new) == [step]
        assert {r["kind"] for r in new} == {"span", "comm", "mem", "step"}
        assert reader.read_new() == []  # nothing appended: nothing new
    with path.open("ab") as fh:
        fh.write(arrow_format.END_OF_STREAM)
    assert reader.read_new() == [] and reader.ended and reader.notes == []
    assert reader.offset == path.stat().st_size - len(arrow_format.END_OF_STREAM)


def test_a_message_being_written_waits_at_every_cut(tmp_path: Path) -> None:
    """Cut anywhere (in the marker, the metadata length, the metadata, the body): nothing read,
    nothing noted; the rest appended: the whole batch read."""
    path = tmp_path / "rank-00000.arrows"
    header, batches = _growing(path)
    first, second = batches[0], batches[1]
    cuts = sorted({1, 3, 4, 5, 7, 8, 9, 100, len(second) // 2, len(second) - 8, len(second) - 1})
    for cut in cuts:
        path.write_bytes(header + first + second[:cut])
        reader = ArrowTail(path)
        assert _steps(reader.read_new()) == [0]
        assert reader.read_new() == [] and reader.notes == [] and not reader.ended, cut
        with path.open("ab") as fh:
            fh.write(second[cut:])
        assert _steps(reader.read_new()) == [1], cut
        assert reader.notes == []
    # a schema message cut short waits too
    path.write_bytes(header[:50])
    reader = ArrowTail(path)
    assert reader.read_new() == [] and reader.notes == []
    with path.open("ab") as fh:
        fh.write(header[50:] + first)
    assert _steps(reader.read_new()) == [0]


def test_a_corrupt_message_ends_the_file_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "rank-00000.arrows"
    header, batches = _growing(path)
    broken = bytearray(batches[1])
    broken[len(broken) // 2 :] = b"\x07" * (len(broken) - len(broken) // 2)  # the body
    path.write_bytes(header + batches[0] + bytes(broken) + batches[2])
    reader = ArrowTail(path)
    assert _steps(reader.read_new()) == [0]
    assert reader.ended and any("unreadable" in note for note in reader.notes), reader.notes
    with path.open("ab") as fh:
        fh.write(batches[2])
    assert reader.read_new() == []  # nothing after the corrupt batch is read
    # garbage where a message should begin
    path.write_bytes(header + batches[0] + b"garbage!" * 4)
    reader = ArrowTail(path)
    assert _steps(reader.read_new()) == [0]
    assert reader.ended and any("no continuation marker" in n for n in reader.notes)


def test_the_full_readers_limits_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    header = arrow_format.stream_header()
    batch = pa.ipc.read_record_batch(
        pa.py_buffer(arrow_format.encode_batch(rank_records(0)[0])), arrow_format.STREAM_SCHEMA
    )
    compressed = tmp_path / "lz4" / "rank-00000.arrows"
    compressed.parent.mkdir()
    compressed.write_bytes(stream(arrow_format.STREAM_SCHEMA, [batch], compression="lz4"))
    reader = ArrowTail(compressed)
    assert reader.read_new() == []
    assert reader.ended and any("compressed" in n for n in reader.notes), reader.notes

    other = tmp_path / "other" / "rank-00000.arrows"  # an Arrow stream of another schema
    other.parent.mkdir()
    table = pa.record_batch([pa.array([1, 2])], names=["x"])
    other.write_bytes(stream(table.schema, [table]))
    reader = ArrowTail(other)
    assert reader.read_new() == []
    assert reader.ended and any("not a diag Arrow rank file" in n for n in reader.notes)

    # a body declared larger than one read can hold: refused at once, never waited for
    message = arrow_format.encode_batch(rank_records(0)[0])
    metadata = pa.ipc.read_message(pa.py_buffer(message)).metadata.to_pybytes()
    forged = bytearray(message)
    struct.pack_into("<q", forged, message.index(metadata) + _body_length_offset(metadata), 2**40)
    huge = tmp_path / "huge" / "rank-00000.arrows"
    huge.parent.mkdir()
    huge.write_bytes(header + bytes(forged))
    reader = ArrowTail(huge)
    assert reader.read_new() == []
    assert reader.ended and any("cannot be read" in n for n in reader.notes), reader.notes

    monkeypatch.setattr(tail, "READ_MAX_BYTES", len(message) - 1)
    big = tmp_path / "big" / "rank-00000.arrows"
    big.parent.mkdir()
    big.write_bytes(header + message)
    reader = ArrowTail(big)
    assert reader.read_new() == [] and reader.read_new() == []  # the schema, then the batch
    assert reader.ended and any("cannot be read" in n for n in reader.notes), reader.notes


def test_a_long_backlog_is_read_over_several_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rank-00000.arrows"
    header, batches = _growing(path)
    with path.open("ab") as fh:
        fh.write(b"".join(batches))
    monkeypatch.setattr(tail, "READ_MAX_BYTES", len(header) + max(map(len, batches)) + 10)
    reader = ArrowTail(path)
    seen: list[int] = []
    for _ in range(6):
        seen += _steps(reader.read_new())
    assert seen == [0, 1, 2] and reader.notes == []


def test_the_arrow_file_is_preferred_as_the_loader_prefers_it(tmp_path: Path) -> None:
    assert open_tail(tmp_path, 0) is None
    (tmp_path / "rank-00000.jsonl").write_text("")
    assert type(open_tail(tmp_path, 0)).__name__ == "JsonlTail"
    (tmp_path / "rank-00000.arrows").write_bytes(b"")
    assert isinstance(open_tail(tmp_path, 0), ArrowTail)


def test_run_tail_reads_an_arrow_run_as_its_jsonl_twin(tmp_path: Path) -> None:
    jsonl = shutil.copytree(GOLDEN / "dp-straggler", tmp_path / "jsonl")
    arrow = shutil.copytree(GOLDEN / "dp-straggler", tmp_path / "arrow")
    assert convert_run(arrow, "arrow")[0] == 2
    reports = []
    for run in (jsonl, arrow):
        run_tail = RunTail(run)
        manifest = run_tail.manifest()
        assert manifest is not None
        run_tail.poll(manifest)
        last = run_tail.finished_step(manifest.world_size)
        assert last is not None
        reports.append(diagnose(run_tail.window(manifest, last))[1])
        assert run_tail.skipped == []
    assert json.dumps(reports[0], sort_keys=True) == json.dumps(reports[1], sort_keys=True)
    assert any(f["rule"] == "BAL001" for f in reports[1]["findings"])


def test_run_tail_follows_a_growing_arrow_run(tmp_path: Path) -> None:
    """The collectors' writer, flushed a step at a time: each poll sees the new step only."""
    run = write_run(tmp_path, world=2)
    for rank in (0, 1):  # start over from the schema
        (run / arrow_format.rank_file_name(rank)).write_bytes(arrow_format.stream_header())
    run_tail = RunTail(run)
    manifest = run_tail.manifest()
    assert manifest is not None
    run_tail.poll(manifest)
    assert run_tail.finished_step(2) is None
    steps = [[arrow_format.encode_batch(s) for s in rank_records(r)] for r in (0, 1)]
    for step in range(3):
        for rank in (0, 1):
            with (run / arrow_format.rank_file_name(rank)).open("ab") as fh:
                fh.write(steps[rank][step])
        run_tail.poll(manifest)
        assert run_tail.finished_step(2) == step
        assert len(run_tail.records["step"]) == 2 * (step + 1)
    assert run_tail.skipped == []
