"""Equal argument sets of a trace's events are kept as one object while the trace is read
(files.SharedArgs, issue 43: a worker's memory), and the records are the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.cli.main import main
from diag.read.kineto import files
from diag.read.kineto.events import BATCH_DECODER, FAST
from diag.read.kineto.kernels import KernelPatterns

pytestmark = pytest.mark.skipif(not FAST, reason="without msgspec no trace is streamed")


def test_equal_argument_sets_are_one_object_and_a_launch_keeps_its_own() -> None:
    events = BATCH_DECODER.decode(b"""[
        {"ph": "X", "name": "record_param_comms", "args": {"Collective name": "send", "Seq": 1}},
        {"ph": "X", "name": "record_param_comms", "args": {"Collective name": "send", "Seq": 1}},
        {"ph": "X", "name": "record_param_comms", "args": {"Collective name": "send", "Seq": 2}},
        {"ph": "X", "name": "cudaLaunchKernel", "args": {"correlation": 7}},
        {"ph": "X", "name": "cudaLaunchKernel", "args": {"correlation": 7}},
        {"ph": "X", "name": "aten::mm", "args": {"Input Dims": [[1, 2]]}},
        {"ph": "X", "name": "aten::mm", "args": {"Input Dims": [[1, 2]]}}
    ]""")
    share = files.SharedArgs()
    kept = [share.one(event.args) for event in events]
    assert kept[0] is kept[1] is events[0].args and kept[2] is not kept[0]
    assert kept[2].seq == 2
    assert kept[3] is events[3].args and kept[4] is events[4].args  # a launch's: its own
    assert kept[5] is events[5].args and kept[6] is events[6].args  # a list: not hashable


def test_a_trace_reads_the_same_with_its_argument_sets_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "traces"
    result = CliRunner().invoke(main, [
        "simulate", "--layout", "dp=2,pp=2", "-m", "4", "--steps", "3", "--format", "kineto",
        "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    trace = sorted(out.glob("*.json"))[1]
    shared = files.parse_file(trace, KernelPatterns())
    monkeypatch.setattr(files.SharedArgs, "one", lambda self, args: args)
    decoded = files.parse_file(trace, KernelPatterns())
    assert shared.records == decoded.records and len(shared.records["comm"]) > 10
    assert shared.device_time == decoded.device_time


def test_a_kernels_own_set_keeps_its_id_and_shares_its_repeated_values(monkeypatch) -> None:
    events = BATCH_DECODER.decode(b"""[
        {"ph": "X", "cat": "kernel", "args": {"correlation": 7, "Collective name": "allreduce",
         "dtype": "Float", "In msg nelems": 4096, "Process Group Name": "0", "Seq": 1}},
        {"ph": "X", "cat": "kernel", "args": {"correlation": 8, "Collective name": "allreduce",
         "dtype": "Float", "In msg nelems": 4096, "Process Group Name": "0", "Seq": 2}},
        {"ph": "X", "cat": "kernel", "args": {"correlation": 9, "Collective name": "allreduce",
         "dtype": "Float", "In msg nelems": 4096.0, "Process Group Name": 0, "Seq": 3}}
    ]""")
    first, second, third = (event.args for event in events)
    assert first.collective is not second.collective  # decoded apart
    share = files.SharedArgs()
    kept = [share.one(args) for args in (first, second, third)]
    assert kept == [first, second, third]  # each its own set: ids and sequence numbers kept
    assert [(a.correlation, a.seq) for a in kept] == [(7, 1), (8, 2), (9, 3)]
    assert second.collective is first.collective and second.dtype is first.dtype
    assert second.in_nelems is first.in_nelems and second.group_name is first.group_name
    # equal but of another type: not shared (4096.0 == 4096, 0 != "0")
    assert type(third.in_nelems) is float and type(third.group_name) is int
    # past MAX_SHARED_ARGS distinct values, new ones are left as decoded (a hostile trace)
    monkeypatch.setattr(files, "MAX_SHARED_ARGS", len(share.values))
    late = BATCH_DECODER.decode(b"""[{"ph": "X", "args": {"correlation": 10,
        "Collective name": "broadcast"}}, {"ph": "X", "args": {"correlation": 11,
        "Collective name": "broadcast"}}]""")
    a, b = (share.one(event.args) for event in late)
    assert a.collective == b.collective == "broadcast" and a.collective is not b.collective
    assert len(share.values) <= files.MAX_SHARED_ARGS
