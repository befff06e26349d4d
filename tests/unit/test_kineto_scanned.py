"""The C scanner's columns (diag/read/kineto/scanned.py, issue 43) leave the converter and the
device time exactly as msgspec's decoding and one_pass.take leave them: the same lists,
dicts, counts and argument sets, in the same order.
- every real trace in ../shared/real-traces (skipped when absent) and a simulated folder;
- random events written as JSON as a profiler or a hostile file may write them (ints, floats
  of any digits, exponents, NaN-free odd values, escapes and text beyond ASCII, strings as
  threads or ids, nulls, duplicated keys, nested arguments), in any batching;
- text that is not events: the scanner hands it back to msgspec, which refuses it as before.
"""

from __future__ import annotations

import gzip
import json
from array import array
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.cli.main import main
from diag.read.kineto import device_arrays, one_pass, scan_columns, scanned, scanned_take, stream
from diag.read.kineto.convert import Scan
from diag.read.kineto.device import DeviceScan
from diag.read.kineto.events import ABSENT
from diag.read.kineto.files import SharedArgs
from diag.read.kineto.stream import NotStreamable, stream_events
from diag.read.kineto.trace_folder import trace_files

pytestmark = pytest.mark.skipif(not scanned.AVAILABLE, reason="the C scanner is not built")

REAL_TRACES = Path(__file__).parents[3] / "shared" / "real-traces"
REAL_FILES = sorted(
    f
    for folder in (REAL_TRACES.rglob("*") if REAL_TRACES.is_dir() else [])
    if folder.is_dir()
    for f in trace_files(folder)
)


def _plain(value: Any) -> Any:
    if isinstance(value, device_arrays.DeviceEvents):
        return value.rows()
    if isinstance(value, array):
        return (value.typecode, value.tolist())
    if isinstance(value, dict):
        return [(k, _plain(v)) for k, v in value.items()]  # keys in order
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _read(path: Path, columns: bool) -> tuple[str, list[int]]:
    """`_read_any`'s state and sharing, the scanner having read some batch when asked to."""
    state, identity, rows = _read_any(path, columns)
    if columns:
        assert rows > 0, "the scanner read no batch"
    return state, identity


def _read_any(path: Path, columns: bool) -> tuple[str, list[int], int]:
    """The whole state one trace leaves (as text, every container in order), which argument
    sets are one object (SharedArgs' sharing: the same pattern both ways), and the rows the
    scanner read (hostile text may be all msgspec's)."""
    scan, device, share = Scan(), DeviceScan(), SharedArgs()
    counted: dict[str, int] = {"columns": 0}

    def take_columns(batch: scanned.ScannedBatch) -> None:
        counted["columns"] += len(batch.rows)
        scanned_take.take_scanned(batch, scan, device, share.one)

    stream_events(
        path, lambda b: one_pass.take(b, scan, device, share.one),
        take_columns if columns else None,
    )  # fmt: skip
    out = scan.result()
    state = [(name, _plain(getattr(out, name))) for name in out.__dataclass_fields__]
    # the reasons events were skipped, counted: noted sorted (files.parse_file), so their
    # order is no state (the scanner meets a batch's kinds in another order than msgspec)
    state = [(name, sorted(value) if name == "skipped" else value) for name, value in state]
    state += [(name, _plain(getattr(device, name))) for name in
              ("whole_us", "cpu_start", "cpu_correlation", "step_starts", "device")]  # fmt: skip
    state.append(("host", device.host.calls))
    kept = [a for rows in out.params.values() for *_, a in rows]
    kept += [a for rows in out.annotations.values() for *_, a in rows]
    kept += [a for a in out.gpu_args if a is not None]
    first_seen: dict[int, int] = {}
    identity = [first_seen.setdefault(id(a), len(first_seen)) for a in kept]
    return repr(state), identity, counted["columns"]


def _same_both_ways(path: Path) -> None:
    plain, plain_identity = _read(path, columns=False)
    columns, columns_identity = _read(path, columns=True)
    assert columns == plain
    assert columns_identity == plain_identity


@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-traces is absent")
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces_read_alike_as_columns(path: Path) -> None:
    _same_both_ways(path)


def test_a_simulated_folder_reads_alike_as_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In batches of 16 KiB, so that a scope's argument text kept in one batch is known in the
    next ones (ScanMemo.texts): the sharing is still SharedArgs' own."""
    out = tmp_path / "traces"
    result = CliRunner().invoke(main, [
        "simulate", "--layout", "dp=2,pp=2", "-m", "4", "--steps", "3", "--format", "kineto",
        "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    monkeypatch.setattr(stream, "CHUNK_BYTES", 2**14)
    known = []
    own_arguments = scanned._own_arguments

    def counted(*given: Any) -> Any:
        found = own_arguments(*given)
        known.append(int(found[2].sum()))
        return found

    monkeypatch.setattr(scanned, "_own_arguments", counted)
    for path in sorted(out.glob("*.json")):
        _same_both_ways(path)
    assert sum(known) > 0  # argument texts were known from earlier batches


# ---- random events, written as text

_numbers = st.one_of(
    st.integers(-(2**63), 2**64),
    st.integers(0, 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(0, 1e16, allow_nan=False).map(lambda v: round(v, 3)),
    st.decimals(-(10**17), 10**17, places=3, allow_nan=False, allow_infinity=False),
)
_text = st.one_of(
    st.sampled_from(["X", "i", "kernel", "cpu_op", "cuda_runtime", "Trace", "Kernel",
                     "gpu_user_annotation", "user_annotation", "cuda_profiler_range",
                     "mtia_runtime", "xpu_runtime", "gpu_memcpy", "record_param_comms",
                     "nccl:send", "nccl:all_reduce", "ncclDevKernel_AllReduce",
                     "ProfilerStep#3", "ProfilerStep#1099511627776", "gloo:all_reduce",
                     "c10d::allreduce_", "cudaLaunchKernel", "cudaStreamSynchronize",
                     "aten::item", "enumerate(DataLoader)#x", "Event Sync", "aten::mm",
                     "", "µs", "a\"b", "tab\there"]),
    st.text(max_size=6),
)  # fmt: skip
_value: Any = st.recursive(
    st.one_of(st.none(), st.booleans(), _numbers, _text),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=6,
)
_args = st.fixed_dictionaries(
    {},
    optional={
        "correlation": st.one_of(st.integers(-5, 2**54), st.none(), _value),
        "stream": st.one_of(st.integers(-2, 30), _value),
        "Collective name": st.sampled_from(["allreduce", "send", "recv", "_allgather_base"]),
        "In msg nelems": st.integers(0, 2**20),
        "Process Group Ranks": st.sampled_from(["[0, 1]", "[0, 1, 2, 3]"]),
        "Seq": st.integers(0, 100),
        "External id": st.integers(0, 99),
        "bandwidth": _numbers,
        "nested": _value,
    },
)
_regular = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i"]),
        "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "user_annotation",
                                "gpu_memcpy", "Trace", "gpu_user_annotation"]),
        "name": _text,
        "ts": st.one_of(st.integers(0, 10**7), st.integers(0, 10**10).map(lambda v: v / 1000),
                        st.integers(1_700_000_000_000_000, 1_700_000_001_000_000)),
        "dur": st.one_of(st.integers(-2, 50), st.integers(-2, 10**5).map(lambda v: v / 1000)),
        "tid": st.integers(0, 3),
    },
    optional={
        "args": st.fixed_dictionaries({}, optional={
            "correlation": st.integers(-2, 40), "stream": st.integers(-1, 8),
            "Collective name": st.just("allreduce"), "External id": st.integers(0, 9),
        }),
    },
)  # fmt: skip
"""Events as a profiler writes them (most of a batch, so that the scanner reads it)."""
_any = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.one_of(st.sampled_from(["X", "X", "X", "i", "s"]), _value),
        "cat": st.one_of(_text, _value),
        "name": st.one_of(_text, _value),
        "ts": st.one_of(_numbers, st.integers(1_700_000_000_000_000, 1_700_000_001_000_000),
                        _value),
        "dur": st.one_of(st.integers(-5, 10**6), _numbers, _value),
        "tid": st.one_of(st.integers(0, 9), st.sampled_from(["7", "stream 7"]), _value),
        "pid": st.integers(0, 9),
        "args": st.one_of(_args, st.none(), _value),
    },
)  # fmt: skip
"""Events as a hostile file may write them."""
_event = st.one_of(_regular, _regular, _regular, _any)


def _written(event: dict[str, Any], style: int) -> str:
    """An event as JSON text: compact, spaced, with a key written twice, or escaped."""
    text = json.dumps(event, ensure_ascii=style == 3, default=str, separators=(",", ":")
                      if style == 0 else (", ", ": "))  # fmt: skip
    if style == 2 and len(event) > 0:
        key = next(iter(event))
        text = text[:-1] + f', "{key}": null}}'
    return text


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(_event, st.integers(0, 3)), min_size=1, max_size=40),
    st.integers(1, 4),
)
def test_random_events_read_alike_as_columns(
    tmp_path_factory: pytest.TempPathFactory, events: list[tuple[dict, int]], batch_kib: int
) -> None:
    folder = tmp_path_factory.mktemp("scanned")
    body = ",\n".join(_written(event, style) for event, style in events)
    path = folder / "t.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + body + "\n]}")
    original = stream.CHUNK_BYTES
    stream.CHUNK_BYTES = batch_kib * 256  # several batches, cut anywhere
    try:
        results = []
        for columns in (False, True):
            try:
                results.append(("read", _read_any(path, columns)[:2]))
            except NotStreamable as refused:
                results.append(("refused", str(refused)))
    finally:
        stream.CHUNK_BYTES = original
    assert results[0] == results[1]


# ---- the scanner alone


def _scan(text: bytes) -> scanned.ScannedBatch | None:
    return scanned.scan_batch(bytearray(text), 0, len(text), scanned.ScanMemo())


@pytest.mark.parametrize(
    "text",
    [b'{"ph": "X"', b'{"ph": "X"},', b'{"ph": "X",}', b'{"name": "a}', b'{"ts": 01}',
     b'{"ts": 1.}', b'{"ts": tru}', b'[1]', b'{"a": "\\x"}', b'{"a": "\x01"}', b'{"ts": -}',
     b'{"a": ' + b"[" * 80 + b"]" * 80 + b"}", b'{"ts": 1740461679479712.500'],
)  # fmt: skip
def test_text_that_is_not_events_goes_to_msgspec(text: bytes) -> None:
    assert _scan(text) is None


def test_what_the_scanner_does_not_read_exactly_is_msgspec_s() -> None:
    odd = [
        b'{"ph": "X", "name": "\\u00b5s", "ts": 1, "dur": 1}',  # an escape in a kept string
        b'{"ph": "X", "name": "a", "ts": 1e3, "dur": 1}',  # an exponent in a time
        b'{"ph": "X", "name": "a", "ts": 1, "dur": 1, "tid": "7"}',  # a thread as text
        b'{"ph": "X", "name": "a", "ts": 1, "ts": 2}',  # a key twice
        b'{"ph": "X", "ts": 1, "args": {"correlation": null}}',  # null is not absent
        b'{"ph": "X", "ts": 99999999999999999999}',  # past int64
        b'{"ph": "X", "ts": 1, "args": {"note": "caf\xc3\xa9"}}',  # beyond ASCII
    ]
    batch = _scan(b",".join(odd))
    assert batch is not None
    assert batch.rows[:, scan_columns.KIND].tolist() == [scan_columns.ODD] * len(odd)
    assert batch.by_loop.all() and len(batch.decoded) == len(odd)
    plain = b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1740461679479712.500, ' \
            b'"dur": 2.25, "tid": 7, "args": {"stream": 7, "correlation": 9, ' \
            b'"bandwidth": 0.08888888888888889, "e": 1.5e-05}}'  # fmt: skip
    batch = _scan(plain)
    assert batch is not None and not batch.by_loop.any()
    row, times = batch.rows[0], batch.times[0]
    col = scan_columns
    assert times[col.F_TS] == float("1740461679479712.500") and times[col.F_DUR] == 2.25
    assert (row[col.STREAM], row[col.CORRELATION], row[col.TID]) == (7, 9, 7)
    assert batch.strings == ["X", "kernel", "k"]


def test_a_gzipped_trace_reads_alike_as_columns(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "ts": 1000 + 10 * i, "dur": 5,
         "tid": 1 + i % 2, "args": {"External id": i}}
        for i in range(5000)
    ] + [{"ph": "X", "cat": "kernel", "name": "k", "ts": 2000.5 + i, "dur": 0.5, "tid": 7,
          "args": {"stream": 7, "correlation": i}} for i in range(3000)]  # fmt: skip
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    _same_both_ways(path)


def test_a_batch_of_more_events_than_rows_is_msgspec_s(monkeypatch: pytest.MonkeyPatch) -> None:
    text = b",".join([b'{"ph": "X", "ts": 1, "dur": 1}'] * 300)
    batch = _scan(text)
    assert batch is not None and len(batch.rows) == 300  # more rows asked for, once
    monkeypatch.setattr(scanned, "MAX_ROWS", 256)
    assert _scan(text) is None


def test_a_repeated_scope_s_arguments_are_the_set_kept_for_their_text() -> None:
    """A `record_param_comms` argument text seen before is the set SharedArgs keeps for it,
    not decoded again, once SharedArgs has returned a kept set for it (its second time);
    an event without args is decoded not at all; the memo keeps no text past its bounds."""
    scope = (b'{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": %d, "dur": 2,'
             b' "tid": 1, "args": {"Collective name": "send", "Group size": 2%s}}')  # fmt: skip
    note = b'{"ph": "X", "cat": "user_annotation", "name": "nccl:send", "ts": %d, "dur": 3}'
    text = b",".join([scope % (10 * i, b"") for i in range(3)] + [note % 50])
    memo, scan, device, share = scanned.ScanMemo(), Scan(), DeviceScan(), SharedArgs()
    first = scanned.scan_batch(bytearray(text), 0, len(text), memo)
    assert first is not None and first.own_known.tolist() == [False] * 4
    assert first.own_args[3] is None  # the annotation writes no args: nothing decoded
    scanned_take.take_scanned(first, scan, device, share.one)
    kept = [args for *_, args in scan.params[1]]
    assert kept[0] is kept[1] is kept[2]  # as SharedArgs shares them
    assert list(memo.texts.values()) == [kept[0]]  # kept once SharedArgs returned a kept set
    again = scanned.scan_batch(bytearray(text), 0, len(text), memo)
    assert again is not None and again.own_known.tolist() == [True, True, True, False]
    assert all(args is kept[0] for args in again.own_args[:3])
    scanned_take.take_scanned(again, scan, device, share.one)
    assert all(args is kept[0] for *_, args in scan.params[1])
    # texts that differ only at their end are sets of their own, each kept for its text
    other = b",".join(
        scope % (100 + 10 * i, b"" if i % 2 else b', "Seq": %d' % (i // 2 % 2)) for i in range(12)
    )
    for _ in range(3):
        batch = scanned.scan_batch(bytearray(other), 0, len(other), memo)
        assert batch is not None
        scanned_take.take_scanned(batch, scan, device, share.one)
    assert batch.own_known.all()
    written = [None if i % 2 else i // 2 % 2 for i in range(12)] * 3
    read = [None if args.seq is ABSENT else args.seq for *_, args in scan.params[1][6:]]
    assert read == written
    # a text longer than MAX_TEXT_BYTES is decoded each time, never kept
    long = scope % (0, b', "Process Group Ranks": "[%s]"' % b", ".join([b"1"] * 600))
    memo, share = scanned.ScanMemo(), SharedArgs()
    for _ in range(3):
        batch = scanned.scan_batch(bytearray(long), 0, len(long), memo)
        assert batch is not None and not batch.own_known.any()
        scanned_take.take_scanned(batch, Scan(), DeviceScan(), share.one)
    assert not memo.texts


def test_a_collective_kernel_s_arguments_seen_with_other_ids_are_the_kept_set_s_values(
    tmp_path: Path,
) -> None:
    """A collective kernel's argument text seen before but for its `correlation` and
    `External id` is the set kept for it with its own correlation, its values the kept
    set's objects; a text that differs elsewhere (a size, a nested `correlation`, an
    `External id` written twice) is its own. The state is msgspec's either way."""
    kernel = (b'{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": %d,'
              b' "dur": 2, "tid": 7, "args": {%s"device": 0, "stream": 7, "correlation": %d,'
              b' "Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": %d,'
              b' "Process Group Ranks": "[0, 1]"%s}}')  # fmt: skip

    def event(i: int, nelems: int = 1024, before: bytes = b"", after: bytes = b"") -> bytes:
        ids = b'"External id": %d, ' % (5000 + i) if i % 3 else b""  # some write none
        return kernel % (10 * i, before or ids, 100 + i, nelems, after)

    def known(numbered: list[bytes]) -> list[bool]:
        text = b",".join(numbered)
        batch = scanned.scan_batch(bytearray(text), 0, len(text), memo)
        assert batch is not None
        scanned_take.take_scanned(batch, scan, device, share.one)
        return batch.own_known.tolist()

    memo, scan, device, share = scanned.ScanMemo(), Scan(), DeviceScan(), SharedArgs()
    twice = b'"External id": %d, "External id": 1, '
    nested = b', "x": {"correlation": %d}'
    first = [event(0), event(1)]  # without an External id, with one
    second = [event(2), event(3), event(4, nelems=2048), event(5, after=nested % 1),
              event(6, before=twice % 6)]  # fmt: skip
    third = [event(7, nelems=2048), event(8, after=nested % 2), event(9, before=twice % 9)]
    assert known(first) == [False, False]  # kept once taken
    assert known(second) == [True, True, False, False, False]
    assert known(third) == [True, False, False]
    read = scan.out.gpu_args
    assert [args.correlation for args in read] == [100 + i for i in range(10)]
    assert read == _decoded_args(first + second + third)  # every field as msgspec decodes it
    assert read[2] is not read[1] and read[2].dtype is read[1].dtype  # its own, values shared
    path = tmp_path / "kernels.json"
    path.write_bytes(b'{"traceEvents": [' + b",".join((first + second + third) * 3) + b"]}")
    _same_both_ways(path)


def _decoded_args(events: list[bytes]) -> list[Any]:
    from diag.read.kineto.events import BATCH_DECODER

    return [event.args for event in BATCH_DECODER.decode(b"[" + b",".join(events) + b"]")]


def test_texts_are_cut_where_asked_and_nowhere_else() -> None:
    import numpy as np

    cut_texts = scanned.event_scan.cut_texts
    text = b'{"a": 1, "correlation": 12, "b": 2}'
    rows = np.array([[0, 24, 26, 26, 26, 35], [0, 0, 0, 35, 35, 35], [1, 2, 3, 4, 5, 6]], np.int64)
    assert cut_texts(text, rows) == [b'{"a": 1, "correlation": , "b": 2}', text, b'"" ']
    for bad in ([0, 5, 4, 6, 6, 8], [0, 1, 2, 3, 4, 36], [-1, 0, 0, 0, 0, 1]):
        with pytest.raises(ValueError):
            cut_texts(text, np.array([bad], np.int64))
    with pytest.raises(ValueError):
        cut_texts(text, np.zeros(5, dtype=np.int64))  # not six a row
