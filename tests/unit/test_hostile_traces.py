"""Hostile Kineto trace folders: a rank's trace truncated, garbage or not a trace; odd events,
times and ranks; nesting too deep; broken gzip and a gzip bomb; links and folders in place of
files.

The cases and the contract: tests/unit/hostile_corpus.py.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.unit.hostile_corpus import (
    Case,
    Text,
    as_bytes,
    deep,
    family_tests,
    fatal,
    garbage,
    usable,
)
from tests.unit.test_kineto import _step_events, _trace, _x

TRACES = "traces"


def trace_folder(
    rank1: Text | dict[str, Any] | Callable[[], dict[str, Any]] | None,
    name: str = "rank1.pt.trace.json",
) -> Callable[[Path], Path]:
    """A folder of two ranks' traces (rank 0's valid), rank 1's file `rank1` (its content, or
    a trace dict); `None`: rank 0 alone."""

    def build(root: Path) -> Path:
        folder = root / TRACES
        folder.mkdir()
        (folder / "rank0.pt.trace.json").write_text(json.dumps(_trace(0, events=_step_events())))
        made = rank1() if callable(rank1) else rank1
        if made is not None:
            (folder / name).write_bytes(
                as_bytes(json.dumps(made) if isinstance(made, dict) else made)
            )
        return folder

    return build


def events(*extra: Any, distributed: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rank 1's valid trace with `extra` events (or a changed distributedInfo)."""
    trace = _trace(1, events=[*_step_events(), *extra])
    trace["distributedInfo"].update(distributed or {})
    return trace


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


BOMB_BYTES = 2 * 2**30
BOMB_MEMBER_BYTES = 64 * 2**20


def gzip_bomb(path: Path) -> None:
    """2 GiB of spaces after `{"traceEvents": [`, compressed (about 2 MB on disk): one gzip
    member of 64 MiB streamed through GzipFile a chunk at a time, written 32 times (gzip
    allows members end to end), so neither the test nor its time grows with the 2 GiB."""
    member = io.BytesIO()
    chunk = b" " * 2**20
    with gzip.GzipFile(fileobj=member, mode="wb", compresslevel=9, mtime=0) as fh:
        for _ in range(BOMB_MEMBER_BYTES // len(chunk)):
            fh.write(chunk)
    with path.open("wb") as out:
        out.write(gz(b'{"traceEvents": ['))
        for _ in range(BOMB_BYTES // BOMB_MEMBER_BYTES):
            out.write(member.getvalue())


def bomb(alone: bool) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        folder = trace_folder(None)(root)
        if alone:
            (folder / "rank0.pt.trace.json").unlink()
        gzip_bomb(folder / "rank1.pt.trace.json.gz")
        return folder

    return build


def gloo_trace(duration: float) -> dict[str, Any]:
    """Rank 1 on the CPU (gloo): one step, an operator and a gloo all-reduce of `duration`."""
    return _trace(1, events=[
        _x("ProfilerStep#3", "user_annotation", 0, 100), _x("aten::mm", "cpu_op", 10, 20),
        {**_x("gloo:all_reduce", "gloo", 50, duration), "tid": 2},
    ])  # fmt: skip


def deep_manifest_beside(root: Path) -> Path:
    """RUN/traces/ beside a RUN/manifest.json nested 200,000 deep (its layout is looked up)."""
    folder = trace_folder(None)(root)
    (root / "manifest.json").write_text("[" * 200_000)
    return folder


def trace_link_to_itself(root: Path) -> Path:
    folder = trace_folder(None)(root)
    (folder / "rank1.pt.trace.json").symlink_to("rank1.pt.trace.json")
    return folder


def trace_is_a_folder(root: Path) -> Path:
    folder = trace_folder(None)(root)
    (folder / "rank1.pt.trace.json").mkdir()
    return folder


def valid_gz() -> bytes:
    return gz(json.dumps(events()).encode())


def corrupt_deflate() -> bytes:
    data = bytearray(valid_gz())
    data[20:60] = garbage(40)
    return bytes(data)


def kernel(ts: Any = 20, dur: Any = 5, **args: Any) -> dict[str, Any]:
    return _x("gemm", "kernel", ts, dur, **{"correlation": 11, **args})


ODD_COMM_ARGS = {"Collective name": {"a": 1}, "In msg nelems": "many", "Out msg nelems": 10**30,
                 "dtype": ["Float"], "Group size": "two"}  # fmt: skip


def repeated_correlation(count: int) -> dict[str, Any]:
    """`count` CPU launches and `count` kernels sharing one correlation id over two steps:
    counting each kernel once per launch would make count**2 rows."""
    times = [i * 1e-3 for i in range(count)]
    launches = [_x("cudaLaunchKernel", "cuda_runtime", 1 + t, 1e-3, correlation=7) for t in times]
    kernels = [_x("gemm", "kernel", 10 + t, 1e-3, correlation=7, stream=7) for t in times]
    return events(_x("ProfilerStep#4", "user_annotation", 200, 100), *launches, *kernels)


NAME = "rank1.pt.trace.json"
GZ = NAME + ".gz"
CASES = {
    "kineto.json/truncated": usable(
        trace_folder(json.dumps(events()).encode()[:300]), 1, "not valid JSON", cli=True
    ),
    "kineto.json/garbage": usable(trace_folder(garbage(4096)), 1, NAME),
    "kineto.json/empty": usable(trace_folder(b""), 1, "not valid JSON"),
    "kineto.json/invalid-utf8": usable(
        trace_folder(b'{"traceEvents": [{"name": "\xff"}]}'), 1, NAME
    ),
    "kineto.json/trace-is-a-list": usable(trace_folder(b"[1, 2]"), 1, "not a Kineto trace"),
    "kineto.json/events-not-a-list": usable(
        trace_folder({"traceEvents": {"a": 1}}), 1, "not a Kineto trace"
    ),
    "kineto.events/non-objects": usable(
        trace_folder(events(1, "x", None, [2], True)), 2, "not JSON objects", cli=True
    ),
    "kineto.events/correlation-odd": usable(
        trace_folder(
            events(
                kernel(correlation="x"),
                kernel(correlation=[1]),
                _x("k", "cuda_runtime", 3, 1, correlation=1e300),
            )
        ),
        2,
        None,
    ),
    "kineto.events/comm-args-odd": usable(
        trace_folder(events(_x("record_param_comms", "cpu_op", 2, 5, **ODD_COMM_ARGS))), 2, None
    ),
    "kineto.events/tid-cat-name-odd": usable(
        trace_folder(
            events(
                {
                    "ph": "X",
                    "name": {"n": 1},
                    "cat": ["kernel"],
                    "ts": 20,
                    "dur": 5,
                    "tid": [1],
                    "args": [],
                }
            )
        ),
        2,
        None,
    ),
    "kineto.events/repeated-correlation": usable(
        trace_folder(lambda: repeated_correlation(20_000)), 2, None, cli=True
    ),
    "kineto.times/zero-length-gloo": usable(trace_folder(gloo_trace(0)), 2, None),
    "kineto.times/ts-1e300": usable(
        trace_folder(events(kernel(ts=1e300))), 2, "events skipped", cli=True
    ),
    "kineto.times/ts-2**70": usable(trace_folder(events(kernel(ts=2**70))), 2, "events skipped"),
    "kineto.times/ts-negative-huge": usable(
        trace_folder(events(kernel(ts=-1e300))), 2, "events skipped"
    ),
    "kineto.times/dur-negative": usable(trace_folder(events(kernel(dur=-5))), 2, "events skipped"),
    "kineto.times/dur-1e300": usable(trace_folder(events(kernel(dur=1e300))), 2, "events skipped"),
    "kineto.times/ts-5000-digits": usable(
        trace_folder(f'{{"traceEvents": [{{"ph": "X", "ts": {"9" * 5000}}}]}}'), 1, "not valid JSON"
    ),
    "kineto.times/ts-nan": usable(
        trace_folder(json.dumps(events(kernel(ts=float("nan"))))), 2, None
    ),
    "kineto.times/step-number-huge": usable(
        trace_folder(events(_x(f"ProfilerStep#{10**30}", "user_annotation", 200, 100))),
        2,
        "events skipped",
    ),
    "kineto.deep/args": usable(
        trace_folder(f'{{"traceEvents": [{{"ph": "X", "args": {deep(200_000)}}}]}}'),
        1,
        "nested",
        cli=True,
    ),
    "kineto.deep/args-500": usable(
        trace_folder(
            f'{{"traceEvents": [{{"ph": "X", "ts": 1, "dur": 1, "args": {{"a": {deep(500)}}}}}]}}'
        ),
        2,
        None,
    ),
    "kineto.deep/manifest-beside": Case(deep_manifest_beside, ranks=1),
    "kineto.ranks/world-10**12": usable(
        trace_folder(events(distributed={"world_size": 10**12})), 1, "world_size", cli=True
    ),
    "kineto.ranks/rank-10**12": usable(
        trace_folder(events(distributed={"rank": 10**12})), 1, "rank"
    ),
    "kineto.ranks/negative": usable(trace_folder(events(distributed={"rank": -3})), 1, "rank"),
    "kineto.ranks/twice": fatal(
        trace_folder(events(distributed={"rank": 0})), TRACES, "several trace files claim rank 0"
    ),
    "kineto.gzip/not-gzip": usable(trace_folder(json.dumps(events()), GZ), 1, "gzip", cli=True),
    "kineto.gzip/truncated": usable(trace_folder(valid_gz()[:200], GZ), 1, "gzip"),
    "kineto.gzip/corrupt-deflate": usable(trace_folder(corrupt_deflate(), GZ), 1, "gzip"),
    "kineto.gzip/empty": usable(trace_folder(b"", GZ), 1, NAME),
    "kineto.gzip/bomb": usable(bomb(alone=False), 1, "refused", cli=True),
    "kineto.gzip/bomb-alone": fatal(bomb(alone=True), TRACES, "refused", cli=True),
    "kineto.files/link-to-itself": usable(trace_link_to_itself, 1, None, cli=True),
    "kineto.files/a-folder": usable(trace_is_a_folder, 1, None),
}

test_hostile_input, test_hostile_input_through_the_command = family_tests(CASES)
