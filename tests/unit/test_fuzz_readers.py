"""Property-based fuzzing of the readers: valid rank-file records, manifests and Kineto events,
mutated (a field dropped, retyped to another JSON type, enlarged: huge integers, long strings,
nesting, NaN), never make `load_run` or `load_trace_dir` raise anything but InputError, and
whatever loads gets its metrics, findings and report in every format without an exception."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.api import diagnose
from diag.cli.analyze import FORMATS
from diag.errors import InputError
from diag.read.kineto import load_trace_dir
from diag.read.load import RunData, load_run
from tests.conftest import RunWriter
from tests.unit.test_kineto import _step_events, _trace

FUZZ = settings(
    max_examples=int(os.environ.get("DIAG_FUZZ_EXAMPLES", "80")),  # more for a deeper search
    deadline=None,
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DEEP = "\x00deep:{}\x00"
"""A placeholder for nesting too deep for json.dumps: replaced in the written text."""
_DEEP_TEXT = re.compile(r'"\\u0000deep:(\d+)\\u0000"')

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
enlarged = st.one_of(
    st.sampled_from([2**70, 10**30, -(10**30), 2**63 - 1, -(2**63), 2**62, 2**40, 2**31, -1]),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e300, -1e300, 5e-324]),
    st.integers(min_value=1, max_value=200_000).map(lambda n: "x" * n),
    st.sampled_from([50, 500, 5000]).map(DEEP.format),
    st.integers(min_value=0, max_value=70_000).map(lambda n: [1] * n),
)


@st.composite
def mutated(draw: st.DrawFn, value: dict[str, Any], nested: bool = False) -> dict[str, Any]:
    """`value` with a few of its fields dropped, retyped, enlarged or added (in nested objects
    too when `nested`)."""
    out = json.loads(json.dumps(value))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        target = out
        if nested:
            objects = [v for v in out.values() if isinstance(v, dict)]
            if objects and draw(st.booleans()):
                target = draw(st.sampled_from(objects))
        keys = sorted(target)
        action = draw(st.sampled_from(["drop", "retype", "enlarge", "add"]))
        key = draw(st.sampled_from(keys)) if keys and action != "add" else draw(st.text(max_size=6))
        if action == "drop":
            target.pop(key, None)
        else:
            target[key] = draw(json_values if action in ("retype", "add") else enlarged)
    return out


def dumps(value: Any) -> str:
    """JSON text (NaN and infinities as Python writes them), placeholders made deep."""
    text = json.dumps(value)
    return _DEEP_TEXT.sub(lambda m: "[" * int(m.group(1)) + "]" * int(m.group(1)), text)


def analysed(run: RunData) -> None:
    """The metrics, findings and every rendering of the report, as `diag analyze` makes them."""
    _, report = diagnose(run)
    for render in FORMATS.values():
        render(report)
    assert not [note for note in report["skipped"] if "failed and was skipped" in note]


_RUNS = RunWriter(Path("."))
VALID_RECORDS: list[dict[str, Any]] = [
    {"kind": "meta", "rank": 1, "world_size": 2, "host": "h0", "pid": 7, "clock_offset_ns": 0},
    _RUNS.span(1, "fwd", 100, 130, stage=0, chunk=0),
    _RUNS.span(1, "comm_wait", 170, 175, mb=None),
    _RUNS.comm(1, 160, 175, tag="dp.bucket", dtype="float32", expected_bytes=1000, layer=3),
    _RUNS.mem(1, device_peak=None, host_rss=5, source="tensors"),
    _RUNS.experts(1, layer=0, tokens=[5, 0, 7], dropped=1, capacity=8, aux_loss=0.1),
    {"kind": "event", "step": 1, "name": "grad_norm", "local": 1.5, "global": 2.0},
    _RUNS.step(1, 100, 200),
]


@st.composite
def rank_files(draw: st.DrawFn) -> list[str]:
    """Rank 1's lines: valid records, some of them mutated, in any order."""
    lines = []
    for valid in VALID_RECORDS:
        row = draw(mutated(valid)) if draw(st.booleans()) else valid
        lines.append(dumps(row))
    return draw(st.permutations(lines))


def _run_with_rank_1(folder: Path, lines: list[str]) -> Path:
    """A 2-rank run whose rank 1 also has `lines`."""
    runs = RunWriter(folder)
    return runs.write({0: runs.simple_rank(), 1: [*runs.simple_rank(1), *lines]})


@FUZZ
@given(rank_files())
def test_mutated_records_load_or_fail_with_input_error(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _run_with_rank_1(Path(tmp), lines)
        try:
            run = load_run(run_dir)
        except InputError:
            return
        analysed(run)


VALID_MANIFEST = RunWriter.manifest(
    2,
    layout={"pp": 2, "dp": 1, "microbatches": 4, "schedule": "1f1b"},
    model={"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "micro_batch": 2, "params": 1000},
    groups={"dp": [[0], [1]], "pp": [[0, 1]]},
    hardware={"gpus_per_node": 2, "device_memory_bytes": 2**30, "intra_node_GBps": 100.0},
    command="python train.py",
    steps_completed=3,
)


@FUZZ
@given(mutated(VALID_MANIFEST, nested=True))
def test_mutated_manifests_load_or_fail_with_input_error(manifest: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = RunWriter(Path(tmp))
        rows = [*runs.simple_rank(), runs.comm(1, 60, 90), runs.span(2, "fwd", 210, 220, stage=1)]
        run_dir = runs.write({0: rows, 1: rows}, dumps(manifest))
        try:
            run = load_run(run_dir)
        except InputError:
            return
        analysed(run)


VALID_EVENTS = _step_events()


@st.composite
def traces(draw: st.DrawFn) -> str:
    """Rank 1's trace: its events (some mutated, args included), its distributedInfo maybe."""
    events = [draw(mutated(e, nested=True)) if draw(st.booleans()) else e for e in VALID_EVENTS]
    trace = _trace(1, events=events)
    if draw(st.booleans()):
        trace = draw(mutated(trace, nested=True))
    return dumps(trace)


@FUZZ
@given(traces())
def test_mutated_trace_events_load_or_fail_with_input_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "rank0.pt.trace.json").write_text(json.dumps(_trace(0, events=_step_events())))
        (folder / "rank1.pt.trace.json").write_text(text)
        try:
            run = load_trace_dir(folder, use_cache=False)
        except InputError:
            return
        analysed(run)


@FUZZ
@given(rank_files())
def test_mutated_records_reduce_in_the_workers_as_in_the_tables(lines: list[str]) -> None:
    """A large run's workers reduce each file from its packed columns
    (diag/metrics/file_reduction.py): whatever mutated records load, the reduced time
    breakdown and collective totals are the tables' own, to the bit."""
    from unittest import mock

    import pandas as pd

    from diag.metrics import reduce_rank_files
    from diag.metrics.comm_totals import comm_totals
    from diag.metrics.common import analysed_steps
    from diag.metrics.time_breakdown import time_breakdown
    from diag.read import load

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _run_with_rank_1(Path(tmp), lines)
        try:
            full = load_run(run_dir)
        except InputError:
            return
        with mock.patch.object(load, "REDUCE_SPANS_FROM_BYTES", 0):
            reduced = load_run(run_dir, breakdown=reduce_rank_files)
        windows = analysed_steps(full.steps)[0]
        expected = time_breakdown(full.spans, full.comms, windows)
        assert reduced.rank_steps is not None and reduced.comm_totals is not None
        pd.testing.assert_frame_equal(reduced.rank_steps, expected, check_exact=True)
        pd.testing.assert_frame_equal(
            reduced.comm_totals, comm_totals(full.comms), check_exact=True
        )
