"""The trace's events taken in one loop (one_pass.take, issue 43's speed work) give exactly
what the three loops gave (`SharedArgs`, `Scan.add`, `DeviceScan.add`): the same converter
state, the same device-time state and result; and the device time's inputs taken in numpy
(device_arrays.inputs) equal those the loops give (`device._inputs`); on
- every real trace in ../shared/real-traces (skipped when absent), end to end too: the
  streamed reader's records and device time equal the whole-file reader's, which still
  runs the three loops;
- a simulated trace folder (comm-heavy: a pipeline's sends and receives);
- random events (hypothesis) with the odd values the loops meet: times that are ints,
  floats, NaN, infinities, strings, bools, huge or negative; names and categories of other
  types; threads that are lists; arguments with odd ids; batches of any mix."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.cli.main import main
from diag.read.kineto import device_arrays, one_pass
from diag.read.kineto.convert import Scan, scan, to_records
from diag.read.kineto.device import HTA_PATTERNS, DeviceScan, _inputs, device_time
from diag.read.kineto.events import ABSENT, Args, Kept
from diag.read.kineto.files import SharedArgs, parse_file, read_events, trace_files
from diag.read.kineto.kernels import KernelPatterns
from diag.read.kineto.stream import stream_events

REAL_TRACES = Path(__file__).parents[3] / "shared" / "real-traces"
REAL_FILES = sorted(
    f
    for folder in (REAL_TRACES.rglob("*") if REAL_TRACES.is_dir() else [])
    if folder.is_dir()
    for f in trace_files(folder)
)
PATTERNS = KernelPatterns()
DEVICE_STATE = ("whole_us", "cpu_start", "cpu_correlation", "step_starts", "device")


def _three_loops(batches: list[list[Kept]]) -> tuple[Scan, DeviceScan]:
    scanned, measured, share = Scan(), DeviceScan(), SharedArgs()
    for batch in batches:
        share(batch)
        scanned.add(batch)
        measured.add(batch)
    return scanned, measured


def _one_loop(batches: list[list[Kept]]) -> tuple[Scan, DeviceScan]:
    scanned, measured, share = Scan(), DeviceScan(), SharedArgs()
    for batch in batches:
        one_pass.take(batch, scanned, measured, share.one)
    return scanned, measured


def _assert_same(batches: list[list[Kept]], again: list[list[Kept]]) -> None:
    """The three loops over `batches` and the one loop over `again` (the same events, decoded
    apart: the loops share argument sets in place) agree."""
    old_scan, old_device = _three_loops(batches)
    new_scan, new_device = _one_loop(again)
    for name in DEVICE_STATE:
        assert getattr(new_device, name) == getattr(old_device, name), name
    assert new_device.host.calls == old_device.host.calls
    old, new = old_scan.result(), new_scan.result()
    for name in old.__dataclass_fields__:
        assert getattr(new, name) == getattr(old, name), name
    assert _same(new_device.result(PATTERNS), old_device.result(PATTERNS))


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (a device time of odd events can be NaN)."""
    return repr(a) == repr(b)


def _batches(path: Path) -> list[list[Kept]]:
    found: list[list[Kept]] = []
    stream_events(path, found.append)
    return found


@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-traces is absent")
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces_read_the_same_in_one_loop(path: Path) -> None:
    _assert_same(_batches(path), _batches(path))
    # end to end: the streamed reader (one loop) against the whole file's three loops
    parsed = parse_file(path, PATTERNS)
    whole, _ = read_events(path)
    events = scan(whole.traceEvents)
    assert parsed.records == to_records(parsed.rank or 0, events, PATTERNS)
    assert _same(parsed.device_time, device_time(whole.traceEvents, PATTERNS))


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("one-pass") / "traces"
    result = CliRunner().invoke(main, [
        "simulate", "--layout", "dp=2,pp=2", "-m", "4", "--steps", "4", "--format", "kineto",
        "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return sorted(out.glob("*.json"))


def test_a_simulated_folder_reads_the_same_in_one_loop(simulated: list[Path]) -> None:
    for path in simulated:
        _assert_same(_batches(path), _batches(path))
        parsed = parse_file(path, PATTERNS)
        whole, _ = read_events(path)
        assert parsed.records == to_records(parsed.rank or 0, scan(whole.traceEvents), PATTERNS)
        assert len(parsed.records["comm"]) > 10


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


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(events, max_size=25), max_size=4))
def test_random_events_read_the_same_in_one_loop(batches: list[list[Kept]]) -> None:
    again = [[_copy(e) for e in batch] for batch in batches]
    _assert_same(batches, again)


def _copy(event: Kept) -> Kept:
    args = event.args
    copied = None if args is None else Args(**{f: getattr(args, f) for f in Args.__struct_fields__})
    fields = {f: getattr(event, f) for f in Kept.__struct_fields__}
    return Kept(**(fields | {"args": copied}))


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
    for patterns in (PATTERNS, HTA_PATTERNS):
        given = (device, starts, ids, steps, whole_us, patterns)
        assert _same_inputs(device_arrays.inputs(*given), _inputs(*given))
    # an id that is not a plain int: the loops
    assert device_arrays.inputs([(*device[0][:2], 1.0, *device[0][3:])], starts, ids, steps,
                                whole_us, PATTERNS) is device_arrays.NOT_PLAIN  # fmt: skip
