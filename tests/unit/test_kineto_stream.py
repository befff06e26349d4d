"""Kineto traces read a batch of events at a time (diag/read/kineto/stream.py): the same events
and metadata as the whole file's read, whatever the chunk size, brackets, quotes and
backslashes inside strings included; anything else is refused (NotStreamable) before the
caller reads the file whole. And the standard library's parser where msgspec is missing."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.read.kineto import files, load_trace_dir, stream
from diag.read.kineto.events import KeptTrace
from diag.read.kineto.files import parse_file, read_events
from diag.read.kineto.kernels import KernelPatterns
from tests.unit.test_kineto import REAL_TRACES, _step_events, _trace, _x

TRICKY_NAMES = [
    'a "quoted" {name} [with] brackets',
    "ends in a backslash \\",
    'backslash then quote \\"',
    "\\\\\\",
    '"traceEvents": [',
    "ünïcødé ✓",
    "",
]


def _streamed(path: Path) -> tuple[KeptTrace, list[Any]]:
    events: list[Any] = []
    return stream.stream_events(path, events.extend), events


def _assert_same_as_whole(path: Path) -> None:
    header, events = _streamed(path)
    whole, notes = read_events(path)
    assert notes == []
    assert events == whole.traceEvents
    assert header.traceEvents == []
    assert (header.distributedInfo, header.deviceProperties) == (
        whole.distributedInfo,
        whole.deviceProperties,
    )


def _tricky_trace() -> dict[str, Any]:
    events = [
        *_step_events(),
        *(_x(name, "cpu_op", 5 + i, 1, note=name, grid=[1, [2, {"x": "]"}]]) for i, name in
          enumerate(TRICKY_NAMES)),
        {"ph": "i", "name": "{[", "ts": 3, "args": {"a": {"b": ["}"]}}},
    ]  # fmt: skip
    data = _trace(1, 2, events)
    data["deviceProperties"] = [{"id": 0, "name": "GPU [0] {x}"}]
    return {"before": "traceEvents", **data, "after": ["]", {"traceEvents2": []}]}


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64, 4096, 2**20])
@pytest.mark.parametrize("indent", [None, 2])
def test_any_chunk_size_gives_the_whole_files_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int, indent: int | None
) -> None:
    monkeypatch.setattr(stream, "CHUNK_BYTES", chunk_bytes)
    path = tmp_path / "rank1.json"
    path.write_text(json.dumps(_tricky_trace(), indent=indent, ensure_ascii=False))
    try:
        _assert_same_as_whole(path)
    except stream.NotStreamable:
        assert chunk_bytes < 64  # only chunks smaller than an event may find no place to cut


_TEXT = st.text(alphabet=st.sampled_from('ab"\\{}[],: \n\tü'), max_size=12)
_EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "i"]), "name": _TEXT, "ts": st.integers(0, 10**6)},
    optional={
        "dur": st.integers(0, 100),
        "cat": _TEXT,
        "args": st.dictionaries(_TEXT, st.one_of(_TEXT, st.integers(), st.lists(_TEXT))),
    },
)


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(_EVENT, max_size=8),
    chunk_bytes=st.integers(1, 40),
    metadata=st.dictionaries(_TEXT, _TEXT, max_size=3),
)
def test_random_traces_stream_as_they_read_whole(
    tmp_path_factory: pytest.TempPathFactory,
    events: list[dict[str, Any]],
    chunk_bytes: int,
    metadata: dict[str, str],
) -> None:
    path = tmp_path_factory.mktemp("random") / "rank0.json"
    path.write_text(json.dumps({**metadata, "traceEvents": events, "distributedInfo": metadata}))
    original = stream.CHUNK_BYTES
    stream.CHUNK_BYTES = chunk_bytes
    try:
        _assert_same_as_whole(path)
    except stream.NotStreamable:  # "}," in strings cut a byte at a time: read whole
        pass
    finally:
        stream.CHUNK_BYTES = original


REFUSED = {
    "not an object": '{"traceEvents": [1, {"ph": "X"}]}',
    "an array": '{"traceEvents": [{"ph": "X"}, []]}',
    "trailing comma": '{"traceEvents": [{"ph": "X"},]}',
    "two traceEvents": '{"traceEvents": [{"ph": "X"}], "traceEvents": []}',
    "truncated": '{"traceEvents": [{"ph": "X"}, {"ph": "X", "na',
    "NaN": '{"traceEvents": [{"ph": "X", "ts": NaN}]}',
    "no traceEvents": '{"events": [{"ph": "X"}]}',
    "not an object at the top": '[{"traceEvents": []}]',
    "far key": '{"traceEvents":' + " " * 300 + '[{"ph": "X"}]}',
    "garbage after": '{"traceEvents": [{"ph": "X"}]} x',
    "nested deeply": '{"traceEvents": [{"ph": "X"}], "m": ' + "[" * 5000 + "]" * 5000 + "}",
    "closes too much": '{"traceEvents": [{"ph": "X"}]}}}',
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_is_not_one_array_of_objects_is_read_whole(tmp_path: Path, name: str) -> None:
    """Refused before the events are all handed on; the whole file's read then keeps what it
    can or names the error, as it did before streaming."""
    path = tmp_path / "rank0.json"
    path.write_text(REFUSED[name])
    with pytest.raises(stream.NotStreamable):
        _streamed(path)
    parsed = parse_file(path, KernelPatterns())
    assert parsed.error or parsed.records is not None


def test_a_gzip_bomb_is_refused_while_streaming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(stream, "GZIP_MIN_INFLATED_BYTES", 1000)
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * 10**6 + b"]}"))
    with pytest.raises(files.InputError, match="gzip bomb"):
        _streamed(path)


def test_isal_and_pythons_gzip_give_the_same_text_and_refuse_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gzipped traces are inflated by ISA-L where it is installed (a dependency), by Python's
    gzip otherwise: the same text chunk for chunk, several members read on, and a truncated,
    corrupt or trailing-garbage file refused in one line either way."""
    pytest.importorskip("isal")
    text = json.dumps({"traceEvents": [{"ph": "X", "name": "k" * (i % 50), "ts": i}
                                       for i in range(60_000)]}).encode()  # fmt: skip
    whole = gzip.compress(text, mtime=0)
    files_of = {
        "one member": whole,
        "two members": gzip.compress(text[:1000], mtime=0) + gzip.compress(text[1000:], mtime=0),
        "truncated": whole[: len(whole) // 2],
        "corrupt": whole[:40] + bytes(64) + whole[104:],
        "trailing garbage": whole + b"not gzip",
    }
    read: dict[str, dict[str, object]] = {}
    for reader in ("isal", "gzip"):
        if reader == "gzip":
            monkeypatch.setattr(stream, "_gzip", gzip)
        else:
            assert stream._gzip.__name__ == "isal.igzip"
        for name, data in files_of.items():
            path = tmp_path / reader / f"{name.replace(' ', '-')}.json.gz"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
            try:
                read.setdefault(name, {})[reader] = [len(c) for c in stream.inflated(path)]
            except files.InputError as err:
                assert "truncated or corrupt gzip" in str(err) and "\n" not in str(err)
                read.setdefault(name, {})[reader] = "refused"
    for name in ("one member", "two members"):
        assert read[name]["isal"] == read[name]["gzip"] != "refused", name
        assert sum(read[name]["isal"]) == len(text)  # type: ignore[arg-type]
    for name in ("truncated", "corrupt", "trailing garbage"):
        assert read[name] == {"isal": "refused", "gzip": "refused"}, name


@pytest.mark.skipif(not REAL_TRACES.is_dir(), reason="no ../shared/real-traces")
def test_every_real_trace_streams_as_it_reads_whole() -> None:
    paths = [p for p in sorted(REAL_TRACES.glob("*/*")) if p.is_file()]
    assert paths
    for path in paths:
        _assert_same_as_whole(path)


_WITHOUT_MSGSPEC = """
import json, sys
import diag.read.load  # the run-directory reader needs msgspec; the trace reader does not
sys.modules["msgspec"] = None
from diag.read.kineto import events, load_trace_dir
assert not events.FAST
run = load_trace_dir(sys.argv[1], use_cache=False)
print(json.dumps({name: getattr(run, name).to_json() for name in ("steps", "spans", "comms",
                  "device_time")} | {"skipped": run.skipped}))
"""


def test_without_msgspec_the_standard_parser_reads_the_same(tmp_path: Path) -> None:
    data = _trace(0, 1, [*_step_events(), 7, _x("odd", "cpu_op", 1, 2, correlation="x")])
    (tmp_path / "rank0.json").write_text(json.dumps(data))
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_MSGSPEC, str(tmp_path)],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    run = load_trace_dir(tmp_path, use_cache=False)
    expected = {name: getattr(run, name).to_json() for name in
                ("steps", "spans", "comms", "device_time")} | {"skipped": run.skipped}  # fmt: skip
    assert json.loads(done.stdout) == json.loads(json.dumps(expected))
    assert any("not JSON objects" in note for note in run.skipped)
