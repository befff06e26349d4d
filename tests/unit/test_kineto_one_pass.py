"""The trace's events taken in one loop (one_pass.take, issue 43), the only loop that reads a
trace's events (the streamed reader's and the whole-file reader's), checked against what does
not come from a second copy of it:
- every real trace in ../shared/real-traces (skipped when absent): the loop's state equals
  that recorded in tests/data/kineto_one_pass.json, which the three loops it replaced
  (issue 43's `Scan.add`, `DeviceScan.add` and `SharedArgs`) gave too (recorded again when
  the device events and the host's calls became columns, their starts and durations
  doubles: `parse_file`'s records, device time and notes were compared equal before and
  after on every real trace and a simulated folder, both kernel pattern sets; and again when
  the `gloo:` events and `c10d::` ops kept their arguments, for gloo_sizes.py: without them
  the state equalled the earlier record on every real trace); and the
  streamed reader's records and device time equal the whole-file reader's (two decoders,
  one loop);
- a simulated trace folder (comm-heavy: a pipeline's sends and receives) and random events
  (hypothesis) with the odd values the loop meets (times that are ints, floats, NaN,
  infinities, strings, bools, huge or negative; names and categories of other types; threads
  that are lists; arguments with odd ids; batches of any mix): invariants of what it keeps
  (`_assert_invariants`: every complete event with a time kept once, on the device or the
  host, or counted as skipped; times in bounds) and the same state however the events are
  batched.
And the device time's inputs taken in numpy (device_arrays.inputs) equal those the loops
give (`device._inputs`).

`DIAG_RECORD_ONE_PASS=1 pytest tests/unit/test_kineto_one_pass.py` writes the recorded file
again: only for a change meant to change what the loop keeps, said so in its commit."""

from __future__ import annotations

import hashlib
import json
import math
import os
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.cli.main import main
from diag.contract.limits import MAX_ABS_TIME_NS, MAX_ARG_INTEGER, MAX_STEP
from diag.read.kineto import device_arrays, one_pass
from diag.read.kineto.convert import GPU_CATEGORIES, MAX_TIME_US, Scan, to_records
from diag.read.kineto.device import HTA_PATTERNS, DeviceScan, _inputs
from diag.read.kineto.events import ABSENT, Args, Kept
from diag.read.kineto.files import SharedArgs, parse_file, read_events
from diag.read.kineto.kernels import KernelPatterns
from diag.read.kineto.stream import stream_events
from diag.read.kineto.trace_folder import trace_files

REAL_TRACES = Path(__file__).parents[3] / "shared" / "real-traces"
REAL_FILES = sorted(
    f
    for folder in (REAL_TRACES.rglob("*") if REAL_TRACES.is_dir() else [])
    if folder.is_dir()
    for f in trace_files(folder)
)
RECORDED = Path(__file__).parents[1] / "data" / "kineto_one_pass.json"
PATTERNS = KernelPatterns()
DEVICE_STATE = ("whole_us", "cpu_start", "cpu_correlation", "step_starts", "device")


def _one_loop(batches: list[list[Kept]]) -> tuple[Scan, DeviceScan]:
    scanned, measured, share = Scan(), DeviceScan(), SharedArgs()
    for batch in batches:
        one_pass.take(batch, scanned, measured, share.one)
    return scanned, measured


def _state(batches: list[list[Kept]]) -> tuple[dict[str, Any], str]:
    """What the loop kept of the events: a few figures to read, and its whole state (the
    converter's and the device time's, not what is computed from them later) as text."""
    scanned, device = _one_loop(batches)
    events = scanned.result()
    kept = [(name, _plain(getattr(events, name))) for name in events.__dataclass_fields__]
    kept += [(name, _plain(getattr(device, name))) for name in DEVICE_STATE]
    kept.append(("host_calls", device.host.calls))  # (start, duration, name) a call
    figures = {
        "gpu_events": len(events.gpu_t0),
        "steps": len(events.steps),
        "launches": len(events.launches),
        "cpu_window_ns": [events.cpu_t0, events.cpu_t1],
        "skipped": dict(sorted(events.skipped.items())),
        "device_events": len(device.device),
        "cpu_events": len(device.cpu_start),
    }
    return figures, repr(kept)


def _plain(value: Any) -> Any:
    """The device events' columns as one tuple an event (start, duration, correlation, name,
    category, stream), and the kernels' int64 columns as lists, as the state was recorded."""
    if isinstance(value, device_arrays.DeviceEvents):
        return value.rows()
    return value.tolist() if isinstance(value, array) and value.typecode == "q" else value


def _batches(path: Path) -> list[list[Kept]]:
    found: list[list[Kept]] = []
    stream_events(path, found.append)
    return found


def _key(path: Path) -> str:
    return path.relative_to(REAL_TRACES).as_posix()


def _recorded(path: Path) -> dict[str, Any]:
    figures, text = _state(_batches(path))
    return figures | {"sha256": hashlib.sha256(text.encode()).hexdigest()}


@pytest.mark.skipif(not os.environ.get("DIAG_RECORD_ONE_PASS"), reason="records on request")
@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-traces is absent")
def test_record_the_real_traces_state() -> None:
    RECORDED.write_text(
        json.dumps({_key(path): _recorded(path) for path in REAL_FILES}, indent=1) + "\n"
    )


@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-traces is absent")
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces_read_as_recorded(path: Path) -> None:
    expected = json.loads(RECORDED.read_text())[_key(path)]
    assert _recorded(path) == expected
    _assert_invariants(_batches(path))
    # end to end: the streamed reader against the whole file's (the same loop, decoded apart)
    parsed = parse_file(path, PATTERNS)
    whole, _ = read_events(path)
    scanned, device = _one_loop([whole.traceEvents])
    assert parsed.records == to_records(parsed.rank or 0, scanned.result(), PATTERNS)
    assert _same(parsed.device_time, device.result(PATTERNS))


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (a device time of odd events can be NaN)."""
    return repr(a) == repr(b)


def _finite(value: Any) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


def _ns(us: int | float) -> int:
    return us * 1000 if type(us) is int else round(us * 1000)


def _stream(value: Any) -> int:
    """A stream argument as the loop keeps it: a non-negative integer, else -1 (unknown)."""
    return value if type(value) is int and 0 <= value < MAX_ARG_INTEGER else -1


def _launch(value: Any) -> int:
    """A correlation argument as the loop keeps it: a non-negative integer, also written
    as a float or text, else -1 (none)."""
    try:
        number = int(value) if type(value) in (int, float, str) else -1
    except (ValueError, OverflowError):
        return -1
    return number if 0 <= number < MAX_ARG_INTEGER else -1


def _assert_invariants(batches: list[list[Kept]]) -> None:
    """What the loop keeps, from what the events are (not from how it reads them): a
    complete event with a finite time is a device event (a GPU category), a host event, or
    skipped with its reason; kept times are integer ns within bounds, ends not before
    starts; the steps in time order; and the same state taken in one batch."""
    flat = [event for batch in batches for event in batch]
    timed = [e for e in flat if e.ph == "X" and _finite(e.ts)]
    in_range = [
        e for e in timed
        if abs(e.ts) < MAX_TIME_US and (not _finite(e.dur) or abs(e.dur) < MAX_TIME_US)
        and not (_finite(e.dur) and e.dur < 0)
    ]  # fmt: skip
    on_gpu = [e for e in in_range if type(e.cat) is str and e.cat in GPU_CATEGORIES]
    scanned, device = _one_loop(batches)
    events = scanned.result()
    assert len(events.gpu_t0) == len(on_gpu)
    columns = (events.gpu_name, events.gpu_category, events.gpu_t1, events.gpu_correlation,
               events.gpu_stream, events.gpu_args)  # fmt: skip
    assert all(len(column) == len(on_gpu) for column in columns)
    # a kernel's start and duration: its own, in whole ns (an untimed one: none)
    assert list(events.gpu_t0) == [_ns(e.ts) for e in on_gpu]
    assert [b - a for a, b in zip(events.gpu_t0, events.gpu_t1, strict=True)] == [
        _ns(e.dur) if _finite(e.dur) else 0 for e in on_gpu
    ]
    # a kernel's stream and launch: its arguments', where they are ids, else -1
    arguments = [e.args for e in on_gpu]
    assert list(events.gpu_stream) == [_stream(a.stream if a else ABSENT) for a in arguments]
    assert list(events.gpu_correlation) == [
        _launch(a.correlation if a else ABSENT) for a in arguments
    ]
    out_of_range = sum(
        1 for e in timed
        if abs(e.ts) >= MAX_TIME_US or (_finite(e.dur) and abs(e.dur) >= MAX_TIME_US)
    )  # fmt: skip
    assert events.skipped["a time or duration beyond ±2**61 ns"] == out_of_range
    assert events.skipped["negative duration"] == len(timed) - out_of_range - len(in_range)
    params = [row[:2] for rows in events.params.values() for row in rows]
    kept = [*events.gpu_t0, *events.gpu_t1, *(t for row in params for t in row)]
    assert all(type(t) is int and abs(t) <= MAX_ABS_TIME_NS for t in kept)
    assert all(t1 >= t0 for t0, t1 in zip(events.gpu_t0, events.gpu_t1, strict=True))
    assert all(0 <= step < MAX_STEP and t1 >= t0 for step, t0, t1 in events.steps)
    assert [s[1] for s in events.steps] == sorted(s[1] for s in events.steps)
    # a host event widens the host's window (a step numbered beyond 2**40 too)
    assert (events.cpu_t0 is None) == (len(in_range) == len(on_gpu))
    assert device.whole_us == all(type(e.ts) is int for e in flat)
    assert all(stream >= 0 for stream in device.device.stream)  # a device event has its stream
    assert len(device.cpu_start) == len(device.cpu_correlation)
    _, text = _state(batches)
    assert _state([flat])[1] == text  # however the events come in batches


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("one-pass") / "traces"
    result = CliRunner().invoke(main, [
        "simulate", "--layout", "dp=2,pp=2", "-m", "4", "--steps", "4", "--format", "kineto",
        "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return sorted(out.glob("*.json"))


def test_a_simulated_folder_reads_whole_and_streamed_alike(simulated: list[Path]) -> None:
    assert len(simulated) == 4
    for path in simulated:
        _assert_invariants(_batches(path))
        parsed = parse_file(path, PATTERNS)
        whole, _ = read_events(path)
        scanned, _ = _one_loop([whole.traceEvents])
        assert parsed.records == to_records(parsed.rank or 0, scanned.result(), PATTERNS)
        assert len(parsed.records["comm"]) > 10
        assert sorted({s["step"] for s in parsed.records["step"]}) == [0, 1, 2, 3]


times = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(-1e7, 1e7),
    st.sampled_from([None, "12", True, float("nan"), float("inf"), -1.5, 2**62, -(2**62),
                     2.4e15, -2.4e15, 2**70, 0, 0.0005, 1.0005]),
)  # fmt: skip
ids = st.one_of(
    st.integers(-2, 2**20), st.sampled_from([ABSENT, -1, 2**53, 2**54, "7", 7.0, None, True])
)
names = st.one_of(
    st.sampled_from([
        "aten::mm", "cudaLaunchKernel", "record_param_comms", "nccl:all_reduce", "nccl:send",
        "ProfilerStep#3", "ProfilerStep#1099511627777", "ProfilerStep#x", "gloo:all_reduce",
        "c10d::allreduce_", "ncclDevKernel_SendRecv", "Event Sync", "cudaStreamSynchronize",
        "aten::item", "enumerate(DataLoader)#_next", "Memcpy HtoD", "",
    ]),
    st.integers(0, 3),
    st.just(1.5),
)  # fmt: skip
categories = st.sampled_from([
    "kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "cuda_runtime", "cuda_driver",
    "user_annotation", "gpu_user_annotation", "Trace", "python_function", None, 3,
])  # fmt: skip
arguments = st.one_of(
    st.none(),
    st.builds(
        Args,
        correlation=ids,
        stream=ids,
        collective=st.sampled_from([ABSENT, "send", "recv", "all_reduce", "coalesced"]),
        group_name=st.sampled_from([ABSENT, "0", "5"]),
        seq=st.sampled_from([ABSENT, 1, 2]),
    ),
)
events = st.builds(
    Kept,
    ph=st.sampled_from(["X", "X", "X", "i", "f", None]),
    cat=categories,
    name=names,
    ts=times,
    dur=times,
    tid=st.sampled_from([1, 2, "3", None, [1], 1.0]),
    args=arguments,
)


def test_known_events_are_kept_as_recorded() -> None:
    """A few events whose every kept value is written out here."""
    launch = Args(correlation=5, stream=ABSENT)
    on_stream_0 = Args(correlation="5", stream=0)
    batches = [
        [Kept(ph="X", cat="user_annotation", name="ProfilerStep#2", ts=100, dur=50, tid=1),
         Kept(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=110, dur=2, tid=1,
              args=launch),
         Kept(ph="X", cat="kernel", name="gemm", ts=120.0004, dur=10.5, tid=7,
              args=on_stream_0)],
        [Kept(ph="X", cat="kernel", name="gemm", ts=130, dur=-1, tid=7),
         Kept(ph="X", cat="cpu_op", name="aten::mm", ts=2**62, dur=1, tid=1),
         Kept(ph="i", cat="cpu_op", name="aten::mm", ts=140, dur=1, tid=1),
         # the step's name again, later (not complete: the device time's alone)
         Kept(ph="i", cat="user_annotation", name="ProfilerStep#2", ts=105, dur=1, tid=1)],
    ]  # fmt: skip
    scanned, device = _one_loop(batches)
    events = scanned.result()
    assert (events.gpu_name, events.gpu_category) == (["gemm"], ["kernel"])
    assert (list(events.gpu_t0), list(events.gpu_t1)) == ([120_000], [130_500])
    assert (list(events.gpu_correlation), list(events.gpu_stream)) == ([5], [0])
    assert events.launches == {5: (1, 110_000)} and events.steps == [(2, 100_000, 150_000)]
    assert (events.cpu_t0, events.cpu_t1, events.step_tid) == (100_000, 150_000, 1)
    assert events.skipped == {"negative duration": 1, "a time or duration beyond ±2**61 ns": 1}
    assert device.device.rows() == [(120.0004, 10.5, 5, "gemm", "kernel", 0)]
    assert not device.whole_us and list(device.cpu_start) == [100, 110, 130, 140, 105]
    assert device.step_starts == {"ProfilerStep#2": 105}  # a step's latest start


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(events, max_size=25), max_size=4))
def test_random_events_keep_the_invariants(batches: list[list[Kept]]) -> None:
    _assert_invariants(batches)


# --- the device time's inputs in numpy (device_arrays.inputs) against the loops (_inputs) ---


def _same_inputs(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    arrays = zip(a[:4], b[:4], strict=True)
    return all(
        list(x) == list(y) if x.dtype == object
        else np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
        for x, y in arrays
    ) and repr(a[4]) == repr(b[4])  # fmt: skip


def _device_inputs_agree(device: DeviceScan) -> None:
    for patterns in (PATTERNS, HTA_PATTERNS):
        given = (device.device, device.cpu_start, device.cpu_correlation, device.step_starts,
                 device.whole_us, patterns)  # fmt: skip
        found = device_arrays.inputs(*given)
        assert found is not device_arrays.NOT_PLAIN
        assert _same_inputs(found, _inputs(*given))


@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-traces is absent")
def test_real_traces_device_inputs_in_numpy() -> None:
    for path in REAL_FILES:
        _, device = _one_loop(_batches(path))
        if device.device:
            _device_inputs_agree(device)


def test_a_simulated_folder_device_inputs_in_numpy(simulated: list[Path]) -> None:
    for path in simulated:
        _device_inputs_agree(_one_loop(_batches(path))[1])


device_events = st.tuples(
    st.one_of(st.integers(0, 10**6), st.floats(0, 1e6)),
    st.one_of(st.integers(0, 10**3), st.floats(0, 1e3)),
    st.integers(-1, 12),  # correlation (-1: a sync event's)
    st.sampled_from(["ncclKernel_AllReduce", "gemm", "Memcpy HtoD", "Event Sync", "x"]),
    st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "Memset"]),
    st.sampled_from([7, 13, 7.0, 20]),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(device_events, min_size=1, max_size=30),
    st.lists(st.tuples(st.floats(0, 1e6), st.integers(-1, 12)), max_size=40),
    st.dictionaries(st.sampled_from(["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]),
                    st.floats(0, 1e6), max_size=3),
    st.booleans(),
)  # fmt: skip
def test_random_device_inputs_in_numpy(
    device: list[Any], cpu: list[tuple[float, int]], steps: dict[str, float], whole_us: bool
) -> None:
    starts = array("d", [start for start, _ in cpu])
    ids = [i for _, i in cpu]
    events = device_arrays.DeviceEvents.of(device)
    assert events.rows() == [(float(r[0]), float(r[1]), *r[2:]) for r in device]
    for patterns in (PATTERNS, HTA_PATTERNS):
        given = (events, starts, ids, steps, whole_us, patterns)
        assert _same_inputs(device_arrays.inputs(*given), _inputs(*given))
    # an id that is not a plain int: the loops
    odd = device_arrays.DeviceEvents.of([(*device[0][:2], 1.0, *device[0][3:])])
    assert device_arrays.inputs(odd, starts, ids, steps, whole_us,
                                PATTERNS) is device_arrays.NOT_PLAIN  # fmt: skip
