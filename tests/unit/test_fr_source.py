"""A folder of Flight Recorder dumps alone (diag/read/sources/flight_recorder.py) assumes
nothing it cannot read: its manifest's status is `unknown` (a dump does not say whether the job
ran on) and its layout unknown (a dump names its groups, not their axes; `--layout` gives it);
the status the analysis derives from the entries is the one the report shows. Dumps written by
hand in torch's JSON shape (the real ones: tests/distributed/test_flight_recorder.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from diag.api import analyze_path
from diag.contract import schema
from diag.outputs.report_lines import headline
from diag.read.sources.base import LoadOptions
from diag.read.sources.flight_recorder import FLIGHT_RECORDER


def _entry(seq: int, retired: bool) -> dict[str, Any]:
    return {"process_group": ["0", "default_pg"], "collective_seq_id": seq, "p2p_seq_id": 0,
            "is_p2p": False, "profiling_name": "gloo:all_reduce", "input_sizes": [[8]],
            "input_dtypes": ["Float"], "state": "completed" if retired else "scheduled",
            "retired": retired, "time_created_ns": 10**18 + seq * 10**9}  # fmt: skip


def _dumps(folder: Path, last_seq: dict[int, int], open_seq: dict[int, int]) -> Path:
    """Rank r retired collectives 1..last_seq[r] and waits in open_seq[r] (when given)."""
    folder.mkdir()
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(sorted(last_seq))}}
    for rank, last in last_seq.items():
        entries = [_entry(s, True) for s in range(1, last + 1)]
        if rank in open_seq:
            entries.append(_entry(open_seq[rank], False))
        dump = {"version": "2.10", "pg_config": config, "entries": entries}
        (folder / f"rank-{rank:05d}.json").write_text(json.dumps(dump))
    return folder


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # every group holds the world: once read as dp=world, now unknown
    return _dumps(tmp_path_factory.mktemp("fr") / "hung", {0: 2, 1: 2, 2: 1}, {0: 3, 1: 3})


def test_the_dumps_status_and_layout_are_unknown_until_derived_or_given(hung: Path) -> None:
    run = FLIGHT_RECORDER.load(hung, LoadOptions())
    assert run.manifest.status == schema.RunStatus.UNKNOWN.value
    assert run.manifest.layout == schema.Layout()
    assert (run.manifest.layout_source or "").startswith("unknown")
    given = FLIGHT_RECORDER.load(hung, LoadOptions(layout=schema.Layout(tp=3)))
    assert given.manifest.layout.tp == 3 and given.manifest.layout_source == "given"
    assert given.manifest.status == schema.RunStatus.UNKNOWN.value


def test_the_derived_status_overrides_the_unknown_one(hung: Path) -> None:
    report = analyze_path(hung)
    assert report["run"]["status"] == "unknown"
    assert report["summary"]["status"] == "hung", report["summary"]
    assert report["findings"][0]["rule"] == "FLR001" and report["findings"][0]["ranks"] == [2]
    line = headline(report)
    assert line.startswith("HUNG: rank 2 never joined"), line
    assert "3 ranks (layout unknown: Flight Recorder dumps" in line, line
    assert "status unknown" not in line and line.count("layout unknown") == 1, line


def test_dumps_that_agree_are_undecidable_not_running(tmp_path: Path) -> None:
    report = analyze_path(_dumps(tmp_path / "quiet", {0: 3, 1: 3}, {}))
    assert report["run"]["status"] == "unknown"
    assert report["summary"]["status"] == "undecidable", report["summary"]
    assert not [f for f in report["findings"] if f["rule"].startswith("FLR")]


def test_a_dump_that_is_not_a_regular_file_or_grows_is_refused_in_one_line(tmp_path: Path) -> None:
    """A FIFO named like a dump is refused, not waited on; a file read in chunks past its size
    plus the growth a writer may add is refused as it is read (the one bounded read of input:
    diag/contract/files.py, which a streaming reader iterates too)."""
    import os

    from diag.contract.files import NotReadable, open_regular, regular_chunks
    from diag.read.flight_recorder import read_dump, read_dumps

    folder = _dumps(tmp_path / "dumps", {0: 2}, {})
    os.mkfifo(folder / "rank-00001.json")
    assert read_dumps(folder).ranks == [0]  # the FIFO is not a dump: skipped, not waited on
    with pytest.raises(NotReadable, match="a FIFO, not a regular file"):
        read_dump(folder / "rank-00001.json")
    # the chunks of a file that says its size, read to its end, and a bound that stops a read
    big = tmp_path / "big"
    big.write_bytes(b"x" * 3000)
    with open_regular(big, 10_000) as fh:
        assert b"".join(regular_chunks(fh, big, 10_000, chunk_bytes=512)) == b"x" * 3000
    with open_regular(big, 10_000) as fh, pytest.raises(NotReadable, match="goes on past"):
        list(regular_chunks(fh, big, 1000, chunk_bytes=512))  # past its bound as it is read


def _dumps_of(folder: Path, members: list[int], dumps: dict[int, tuple[int, int | None]]) -> Path:
    """A group of `members`; rank r's dump (only those in `dumps`) retired 1..last and waits
    in `open` when given."""
    folder.mkdir()
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(members)}}
    for rank, (last, open_) in dumps.items():
        entries = [_entry(s, True) for s in range(1, last + 1)]
        entries += [] if open_ is None else [_entry(open_, False)]
        dump = {"version": "2.10", "pg_config": config, "entries": entries}
        (folder / f"rank-{rank:05d}.json").write_text(json.dumps(dump))
    return folder


def test_a_rank_without_a_dump_is_unknown_not_named_beside_one_shown_behind(
    tmp_path: Path,
) -> None:
    """A job torn down after rank 2 failed: rank 1 waits in #3, rank 2's dump ends at #2, rank
    0 left none (its launcher ended it before it dumped, wherever it was). Rank 2 is named;
    rank 0 is neither named nor cleared."""
    folder = _dumps_of(tmp_path / "torn", [0, 1, 2], {1: (2, 3), 2: (2, None)})
    (folder / ".rank-00000.json.partial").write_text('{"entries": [')
    report = analyze_path(folder)
    first = report["findings"][0]
    assert first["rule"] == "FLR001" and first["ranks"] == [2], first["title"]
    assert "rank 0 left no dump: whether it joined, nothing says" in first["title"]
    collective = first["evidence"]["collective"]
    assert collective["missing"] == [2] and collective["unseen"] == [0]
    assert any("rank-00000.json.partial: a dump cut off" in n for n in report["skipped"])


def test_the_wait_is_for_the_rank_without_a_dump_when_every_dumped_member_waits(
    tmp_path: Path,
) -> None:
    folder = _dumps_of(tmp_path / "alone", [0, 1, 2], {1: (2, 3), 2: (2, 3)})
    first = analyze_path(folder)["findings"][0]
    assert first["rule"] == "FLR001" and first["ranks"] == [0], first["title"]
    assert first["title"].startswith("hang: rank 0, which left no dump, never joined"), first
    # a dump with no entry is a rank seen: it issued nothing, so it never joined
    empty = _dumps_of(tmp_path / "empty", [0, 1, 2], {0: (0, None), 1: (2, 3), 2: (2, 3)})
    first = analyze_path(empty)["findings"][0]
    assert first["rule"] == "FLR001" and first["ranks"] == [0], first["title"]
    assert "left no dump" not in first["title"], first["title"]


def test_a_dumps_bounds_are_read_off_its_text_outside_its_strings() -> None:
    """Brackets, braces, commas and escaped quotes inside strings are text, not structure;
    the depth and the values of the rest are bounded (what walking the parsed values did)."""
    from diag.read.flight_recorder import _json_bounds

    tricky = json.dumps({"entries": [{"name": 'a[[[{{{"\\\\"' * 50, "x": [1, 2, [3]]}]})
    assert json.loads(tricky)  # valid JSON whose strings are full of structure's characters
    assert _json_bounds(tricky.encode(), 100, 5) is None  # 5 containers, one in another
    assert _json_bounds(tricky.encode(), 100, 4) == "nested deeper than 4 levels"
    assert _json_bounds(tricky.encode(), 6, 5) == "more than 6 values"
    deep = ("[" * 17 + "]" * 17).encode()
    assert _json_bounds(deep, 100, 16) == "nested deeper than 16 levels"


def test_a_json_dump_over_its_bounds_is_refused_before_it_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dump of more values than the limit is refused from its text: decoding it first would
    build every value (a hostile file's memory) only to refuse it."""
    from diag.read import flight_recorder

    monkeypatch.setattr(flight_recorder, "MAX_FR_OBJECTS", 1_000)
    dump = tmp_path / "rank_0.json"
    dump.write_text(json.dumps({"version": "2.10", "entries": [[0] * 10] * 200}))

    def decoded(*_: Any, **__: Any) -> Any:
        raise AssertionError("decoded before its bounds were read")

    monkeypatch.setattr(flight_recorder.json, "loads", decoded)
    with pytest.raises(ValueError, match="more than 1,000 values"):
        flight_recorder.read_dump(dump)


def test_entries_of_one_collective_read_once_keep_their_own_sequence_and_state(
    tmp_path: Path,
) -> None:
    """A dump's entries repeat a few collectives: what their group, op, sizes and dtypes say
    is read once a shape, and each row keeps its own sequence, state and time; shapes that
    differ in one value only are their own (a size, a dtype's list, a p2p flag)."""
    from diag.read.flight_recorder import FR_COLUMNS, read_dumps

    entries = [_entry(1, True), _entry(2, False), {**_entry(3, False), "input_sizes": [[9]]},
               {**_entry(4, False), "input_dtypes": ["Float", "Float"]},
               {**_entry(5, False), "is_p2p": True, "p2p_seq_id": 7},
               {**_entry(6, False), "input_sizes": [[8.0]]}, "not an entry"]  # fmt: skip
    folder = tmp_path / "d"
    folder.mkdir()
    dump = {"version": "2.10", "pg_config": {}, "entries": entries}
    (folder / "rank-00000.json").write_text(json.dumps(dump))
    table = read_dumps(folder).table
    assert list(table.columns) == list(FR_COLUMNS)
    rows = table.to_dict("records")
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 7, 6]
    assert [r["open"] for r in rows] == [False, True, True, True, True, True]
    assert [r["t_created_ns"] for r in rows] == [10**18 + s * 10**9 for s in (1, 2, 3, 4, 5, 6)]
    assert [r["bytes"] for r in rows[:4]] == [32, 32, 36, 32]
    assert [r["sizes"] for r in rows] == ["[[8]]"] * 2 + ["[[9]]"] + ["[[8]]"] * 2 + ["[[8.0]]"]
    assert [r["p2p"] for r in rows] == [False] * 4 + [True, False]
    assert pd.isna(rows[-1]["bytes"])  # a size that is not an integer: unknown


def test_entries_that_differ_across_ranks_are_named_by_class(tmp_path: Path) -> None:
    """#2: rank 1 broadcast where the others all-reduce (type); #3: rank 2 all-reduced 9
    elements where the others 8 (size); two ranks that differ with no majority: the group's
    usual signature is the common one."""
    from diag.metrics.failure_desync import fr_desync

    folder = tmp_path / "desync"
    folder.mkdir()
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    for rank in range(3):
        entries = [_entry(s, True) for s in range(1, 5)]
        if rank == 1:
            entries[1]["profiling_name"] = "gloo:broadcast"
        if rank == 2:
            entries[2]["input_sizes"] = [[9]]
        dump = {"version": "2.10", "pg_config": config, "entries": entries}
        (folder / f"rank-{rank:05d}.json").write_text(json.dumps(dump))
    found = fr_desync(FLIGHT_RECORDER.load(folder, LoadOptions()))
    assert [(f["class"], f["seq"], f["rank"], f["op"]) for f in found] == [
        ("type mismatch", 2, 1, "broadcast"), ("size mismatch", 3, 2, "all_reduce")
    ]  # fmt: skip
    assert found[1]["sizes"] == "[[9]]" and found[1]["expected"]["sizes"] == "[[8]]"
    two = tmp_path / "two"
    two.mkdir()
    for rank in range(2):
        entries = [_entry(s, True) for s in range(1, 4)]
        entries[2]["input_dtypes"] = ["Half" if rank == 0 else "Float"]
        dump = {"version": "2.10", "pg_config": {}, "entries": entries}
        (two / f"rank-{rank:05d}.json").write_text(json.dumps(dump))
    (tie,) = fr_desync(FLIGHT_RECORDER.load(two, LoadOptions()))
    assert (tie["class"], tie["rank"], tie["expected"]["dtype"]) == ("dtype mismatch", 0, "Float")


def test_a_folder_of_dumps_all_cut_off_is_refused_in_one_line_naming_them(tmp_path: Path) -> None:
    """A job killed while its ranks wrote their dumps leaves only the collector's temporary
    files: read as dumps (not as a folder of nothing), refused with the reason."""
    from diag.errors import InputError

    folder = tmp_path / "flight-recorder"
    folder.mkdir()
    (folder / ".rank-00000.json.partial").write_text('{"version": "2.10", "entries": [{"pro')
    with pytest.raises(InputError, match=r"rank-00000\.json\.partial: a dump cut off"):
        analyze_path(folder)
