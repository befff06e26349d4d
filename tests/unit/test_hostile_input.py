"""Hostile input: broken run directories and trace folders never crash `diag analyze`.

Each case builds a small valid run or trace folder in tmp_path and breaks one thing. The contract
(DESIGN.md, diag/load.py): exit 0 with the good ranks analysed and a note in the report's
`skipped`, or exit 2 with one line `diag: error: PATH: reason` naming the file; never a traceback,
within a minute, and nothing written outside the input's `.diag-cache` (diag/limits.py bounds
whatever would size an allocation or a loop). Every case runs in this process through click's
runner; one case a family (`cli=True`) also runs `diag analyze` as a process.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diag.cli import main
from tests.conftest import BASE_NS, RunWriter
from tests.unit.test_kineto import _step_events, _trace, _x

TIME_LIMIT_S = 60
INPUT = "in"
"""The folder under tmp_path that holds the input (the run or the trace folder is inside)."""


@dataclass(frozen=True)
class Case:
    """A hostile input and what `diag analyze` must make of it: usable (`ranks` analysed, a
    skipped note containing `note` unless None) or unusable (`fatal`: the path the one-line
    error names, relative to the input folder, with `reason` in it)."""

    build: Callable[[Path], Path]  # the input folder -> the path to analyse
    ranks: int = 0
    note: str | None = None
    fatal: str | None = None
    reason: str = ""
    cli: bool = False
    known: str | None = None  # a known failure, outside this change: an expected failure


def usable(build: Callable[[Path], Path], ranks: int, note: str | None, cli: bool = False) -> Case:
    return Case(build, ranks=ranks, note=note, cli=cli)


def fatal(build: Callable[[Path], Path], path: str, reason: str, cli: bool = False) -> Case:
    return Case(build, fatal=path, reason=reason, cli=cli)


# --- run directories ------------------------------------------------------------------------------

RUN = "run"


def valid_run(root: Path, **manifest: Any) -> Path:
    """A 2-rank run of 3 steps (fwd, bwd, an all-reduce), the manifest's fields replaced."""
    runs = RunWriter(root)
    rows = [*runs.simple_rank(), runs.comm(1, 60, 90), runs.mem(1)]
    return runs.write({0: rows, 1: list(rows)}, {**runs.manifest(2), **manifest}, RUN)


def rank1_bytes(data: bytes) -> Callable[[Path], Path]:
    """Rank 1's file replaced by `data`."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / "rank-00001.jsonl").write_bytes(data)
        return run

    return build


Text = str | bytes | Callable[[], str | bytes]
"""File content, or what makes it when the case is built (large content is not kept)."""


def as_bytes(text: Text) -> bytes:
    made = text() if callable(text) else text
    return made.encode() if isinstance(made, str) else made


def rank1_line(line: Text) -> Callable[[Path], Path]:
    """One line added to rank 1's file."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        with (run / "rank-00001.jsonl").open("ab") as fh:
            fh.write(as_bytes(line) + b"\n")
        return run

    return build


def manifest_text(text: Text) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / "manifest.json").write_bytes(as_bytes(text))
        return run

    return build


def manifest_fields(**fields: Any) -> Callable[[Path], Path]:
    return lambda root: valid_run(root, **fields)


def world(world_size: int) -> Callable[[Path], Path]:
    return lambda root: valid_run(root, world_size=world_size, layout={"dp": world_size})


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def self_link(name: str) -> Callable[[Path], Path]:
    """`name` in the run (a rank file, traces/) is a symbolic link to itself."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / name).unlink(missing_ok=True)
        (run / name).symlink_to(name)
        return run

    return build


def traces_loop(root: Path) -> Path:
    """RUN/traces -> RUN: a folder that contains itself."""
    run = valid_run(root)
    (run / "traces").symlink_to("..")
    return run


def a_folder(name: str) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / name).unlink()
        (run / name / "x").mkdir(parents=True)
        return run

    return build


def extra_rank_file(name: str) -> Callable[[Path], Path]:
    """A copy of rank 1's file under another name (a second file of rank 1, or a rank outside
    the world)."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / name).write_bytes((run / "rank-00001.jsonl").read_bytes())
        return run

    return build


def input_loop(root: Path) -> Path:
    (root / "loop").symlink_to("loop")
    return root / "loop"


def garbage(size: int) -> bytes:
    return random.Random(12).randbytes(size)


def record(**fields: Any) -> str:
    """A span of rank 1's step 1 with `fields` changed (a JSON line)."""
    base = {"kind": "span", "step": 1, "mb": 0, "phase": "fwd", "t0": BASE_NS, "t1": BASE_NS + 5}
    return json.dumps({**base, **fields})


def comm(**fields: Any) -> str:
    """An all-reduce of rank 1's step 1 with `fields` changed."""
    base = {"kind": "comm", "op": "all_reduce", "group": "dp", "group_size": 2, "bytes": 8}
    return record(**{**base, **fields})


def experts(tokens: str = "[1, 2]", layer: str = "0") -> str:
    """An experts record, its tokens and layer as JSON text."""
    return f'{{"kind": "experts", "step": 1, "layer": {layer}, "tokens": {tokens}}}'


def event(value: str) -> str:
    """An event with one free field, given as JSON text."""
    return f'{{"kind": "event", "step": 1, "name": "x", "f": {value}}}'


def step(number: int, t0: int = 1, t1: int = 2, loss: str = "1.0") -> str:
    return f'{{"kind": "step", "step": {number}, "t0": {t0}, "t1": {t1}, "loss": {loss}}}'


LONG_LINE = 60 * 2**20
MANIFEST = "run/manifest.json"
RUN_CASES = {
    # truncated
    "run.truncated/line": usable(rank1_line('{"kind": "span", "st'), 2, "not valid JSON", cli=True),
    "run.truncated/manifest": fatal(
        manifest_text('{"schema": "diag.run/1", "wor'), MANIFEST, "not valid JSON"
    ),
    "run.truncated/utf8": usable(
        rank1_line(record(phase="é" * 30).encode()[:-25]), 2, "not valid JSON"
    ),
    # garbage
    "run.garbage/rank-file": usable(rank1_bytes(garbage(65536)), 1, "not valid JSON", cli=True),
    "run.garbage/manifest": fatal(
        manifest_text(garbage(4096)), MANIFEST, "not valid JSON", cli=True
    ),
    "run.garbage/nul-bytes": usable(rank1_bytes(b"\0" * 10000), 1, "not valid JSON"),
    "run.garbage/invalid-utf8-line": usable(
        rank1_line(b'{"kind": "span", "phase": "\xff\xfe"}'), 2, "not valid JSON"
    ),
    "run.garbage/invalid-utf8-manifest": fatal(
        manifest_text(b'{"schema": "\xff"}'), MANIFEST, "not valid JSON"
    ),
    # empty
    "run.empty/rank-file": usable(rank1_bytes(b""), 1, "rank-00001.jsonl: empty", cli=True),
    "run.empty/blank-rank-file": usable(rank1_bytes(b"\n \n\t\n"), 1, "rank-00001.jsonl: empty"),
    "run.empty/manifest": fatal(manifest_text(""), MANIFEST, "not valid JSON"),
    # wrong types
    "run.types/step-string": usable(
        rank1_line(record(step="1")), 2, "not an integer >= 0", cli=True
    ),
    "run.types/t0-string": usable(rank1_line(record(t0="soon")), 2, "null or non-finite t0/t1"),
    "run.types/phase-list": usable(rank1_line(record(phase=["fwd"])), 2, "phase is not a string"),
    "run.types/mb-string": usable(rank1_line(record(mb="0")), 2, "mb is not an integer"),
    "run.types/stage-float": usable(rank1_line(record(stage=1.5)), 2, "stage is not an integer"),
    "run.types/tokens-dict": usable(rank1_line(experts('{"a": 1}')), 2, "not a list of numbers"),
    "run.types/record-is-array": usable(rank1_line("[1, 2, 3]"), 2, "not a JSON object"),
    "run.types/record-is-number": usable(rank1_line("12"), 2, "not a JSON object"),
    "run.types/manifest-world-string": fatal(
        manifest_fields(world_size="2"), MANIFEST, "world_size is '2'", cli=True
    ),
    "run.types/manifest-layout-list": fatal(
        manifest_fields(layout=[1]), MANIFEST, "not a JSON object"
    ),
    "run.types/manifest-is-list": fatal(manifest_text("[1, 2]"), MANIFEST, "not a JSON object"),
    "run.types/manifest-groups-string": fatal(
        manifest_fields(groups={"dp": "0,1"}), MANIFEST, "groups.dp"
    ),
    "run.types/manifest-rank-string": fatal(
        manifest_fields(ranks=[{"rank": "zero"}]), MANIFEST, "ranks"
    ),
    "run.types/manifest-command-list": fatal(
        manifest_fields(command=[[["x"]]]), MANIFEST, "command"
    ),
    # NaN and infinities
    "run.nan/t0": usable(
        rank1_line(record(t0=float("nan"))), 2, "null or non-finite t0/t1", cli=True
    ),
    "run.nan/t1-inf": usable(rank1_line(record(t1=float("inf"))), 2, "null or non-finite t0/t1"),
    "run.nan/tokens-inf": usable(rank1_line(experts("[1, Infinity]")), 2, "not a list of numbers"),
    "run.nan/loss": usable(rank1_line(step(5, loss="NaN")), 2, "loss is NaN"),
    "run.nan/bytes": usable(rank1_line(comm(bytes=float("nan"))), 2, None),
    "run.nan/manifest-bandwidth": usable(
        manifest_fields(hardware={"intra_node_GBps": float("nan")}), 2, None
    ),
    # negative durations
    "run.negative-duration/span": usable(
        rank1_line(record(t1=BASE_NS - 5)), 2, "t1 before t0", cli=True
    ),
    "run.negative-duration/step": usable(rank1_line(step(7, t0=9, t1=2)), 2, "t1 before t0"),
    "run.negative-duration/comm": usable(rank1_line(comm(t1=BASE_NS - 5)), 2, "t1 before t0"),
    # huge integers
    "run.huge/step-2**70": usable(rank1_line(record(step=2**70)), 2, "step", cli=True),
    "run.huge/t0-2**70": usable(rank1_line(record(t0=2**70, t1=2**70 + 1)), 2, "t0/t1"),
    "run.huge/t0-2**62": usable(rank1_line(record(t0=-(2**62), t1=2**62)), 2, "t0/t1"),
    "run.huge/bytes-10**30": usable(rank1_line(comm(group_size=10**30, bytes=10**30)), 2, None),
    "run.huge/mb-10**30": usable(rank1_line(record(mb=10**30)), 2, "mb is not an integer"),
    "run.huge/stage-2**70": usable(rank1_line(record(stage=2**70)), 2, "stage is not an integer"),
    "run.huge/chunk-2**40": usable(rank1_line(record(chunk=2**40)), 2, "chunk is not an integer"),
    "run.huge/layer-2**70": usable(rank1_line(experts(layer=str(2**70))), 2, "layer"),
    "run.huge/experts-10**6": usable(
        rank1_line(lambda: experts(json.dumps([1] * 10**6))), 2, "tokens"
    ),
    "run.huge/label-1MB": usable(rank1_line(record(phase="x" * 2**20)), 2, "phase is longer than"),
    "run.huge/world-10**12": fatal(world(10**12), MANIFEST, "world_size", cli=True),
    "run.huge/world-2**70": fatal(world(2**70), MANIFEST, "world_size"),
    "run.huge/layout-pp-10**30": fatal(
        manifest_fields(layout={"pp": 10**30}), MANIFEST, "layout.pp"
    ),
    "run.huge/manifest-rank-10**30": fatal(
        manifest_fields(ranks=[{"rank": 10**30}]), MANIFEST, "ranks"
    ),
    "run.huge/group-rank-10**12": fatal(
        manifest_fields(groups={"dp": [[0, 10**12]]}), MANIFEST, "groups.dp", cli=True
    ),
    "run.huge/group-rank-negative": fatal(
        manifest_fields(groups={"dp": [[0, -1]]}), MANIFEST, "groups.dp"
    ),
    "run.huge/manifest-5000-digits": fatal(
        manifest_text(f'{{"schema": "diag.run/1", "world_size": {"9" * 5000}}}'),
        MANIFEST,
        "not valid JSON",
    ),
    "run.huge/line-5000-digits": usable(
        rank1_line(f'{{"kind": "step", "step": {"9" * 5000}}}'), 2, "not valid JSON"
    ),
    "run.huge/rank-file-10**20": usable(
        extra_rank_file(f"rank-{10**20}.jsonl"), 2, "outside the world"
    ),
    # step indices
    "run.step/negative": usable(rank1_line(record(step=-1)), 2, "not an integer >= 0"),
    "run.step/2**40": usable(rank1_line(record(step=2**40)), 2, "step", cli=True),
    "run.step/int64-max": usable(rank1_line(step(2**63 - 1)), 2, "step"),
    # deep nesting
    "run.deep/line": usable(rank1_line("[" * 200_000), 2, "nested", cli=True),
    "run.deep/valid-line": usable(rank1_line(deep(200_000)), 2, "nested"),
    "run.deep/event-field": usable(rank1_line(event(deep(200_000))), 2, "nested"),
    "run.deep/event-field-500": usable(rank1_line(event(deep(500))), 2, "nested"),
    "run.deep/manifest": fatal(manifest_text("[" * 200_000), MANIFEST, "nested", cli=True),
    "run.deep/manifest-field": fatal(
        manifest_text(f'{{"schema": "diag.run/1", "world_size": 2, "model": {deep(200_000)}}}'),
        MANIFEST,
        "nested",
    ),
    # a 60 MB line
    "run.long-line/span": usable(
        rank1_line(lambda: record(phase="x" * LONG_LINE)), 2, "longer than", cli=True
    ),
    "run.long-line/event": usable(
        rank1_line(lambda: event(json.dumps("y" * LONG_LINE))), 2, "longer than"
    ),
    # symbolic links
    "run.link/rank-file-to-itself": usable(
        self_link("rank-00001.jsonl"), 1, "cannot read", cli=True
    ),
    "run.link/traces-to-itself": usable(self_link("traces"), 2, None),
    "run.link/traces-loop": usable(traces_loop, 2, None),
    "run.link/input-to-itself": fatal(input_loop, "loop", "no such file"),
    # a folder where a file belongs
    "run.folder/rank-file": usable(a_folder("rank-00001.jsonl"), 1, "cannot read", cli=True),
    "run.folder/manifest": fatal(a_folder("manifest.json"), MANIFEST, "cannot read", cli=True),
    # ranks
    "run.ranks/duplicate": usable(extra_rank_file("rank-000001.jsonl"), 2, "rank 1", cli=True),
    "run.ranks/outside-world": usable(extra_rank_file("rank-00005.jsonl"), 2, "outside the world"),
    "run.ranks/world-2000": usable(world(2000), 2, "1998 of 2000 ranks"),
}

# --- Kineto trace folders -------------------------------------------------------------------------

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
TRACE_CASES = {
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
        trace_folder(events(distributed={"rank": 0})), TRACES, "several trace files claim one rank"
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
CASES = {**RUN_CASES, **TRACE_CASES}


# --- the contract ---------------------------------------------------------------------------------


def snapshot(root: Path, skip: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under `root` (links not followed) but `.diag-cache` folders and `skip`:
    relative path -> (mode, size, modification time); folders by mode only (a cache folder
    made inside one changes its time)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".diag-cache" and Path(folder, d) != skip]
        for name in dirs + files:
            status = os.lstat(Path(folder, name))
            stamp = (0, 0) if stat.S_ISDIR(status.st_mode) else (status.st_size, status.st_mtime_ns)
            found[os.path.relpath(Path(folder, name), root)] = (status.st_mode, *stamp)
    return found


def check_outcome(case: Case, root: Path, code: int, stdout: str, stderr: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    if case.fatal is not None:
        assert code == 2, (stdout[-3000:], stderr[-3000:])
        assert stdout == ""
        assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr[-3000:]
        assert stderr.startswith(f"diag: error: {root / case.fatal}: "), stderr
        assert case.reason in stderr
        return
    assert code == 0, stderr[-3000:]
    report = json.loads(stdout)
    assert report["summary"]["ranks_analysed"] == case.ranks, report["skipped"]
    if case.note is not None:
        assert any(case.note in note for note in report["skipped"]), report["skipped"]
    assert all(len(note) < 1000 for note in report["skipped"])
    assert not [note for note in report["skipped"] if "failed and was skipped" in note]


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """The input folder, a working folder (the current one) and a user cache folder."""
    root, cwd, xdg = tmp_path / INPUT, tmp_path / "cwd", tmp_path / "xdg"
    for folder in (root, cwd, xdg):
        folder.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.chdir(cwd)
    return root, cwd, xdg


def run_case(
    case: Case, places: tuple[Path, Path, Path], analyze: Callable[[Path], tuple[int, str, str]]
) -> None:
    root, _, xdg = places
    target = case.build(root)
    before = snapshot(root.parent, skip=xdg)
    started = time.monotonic()
    code, stdout, stderr = analyze(target)
    assert time.monotonic() - started < TIME_LIMIT_S
    check_outcome(case, root, code, stdout, stderr)
    assert snapshot(root.parent, skip=xdg) == before
    assert all(p.is_dir() or p.relative_to(xdg).parts[0] == "diag" for p in xdg.rglob("*"))


def in_process(path: Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["analyze", str(path), "--format", "json"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def as_process(path: Path) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT_S,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    return done.returncode, done.stdout, done.stderr


def params(cases: dict[str, Case]) -> list[Any]:
    return [
        pytest.param(case, id=name, marks=[pytest.mark.xfail(reason=case.known, strict=True)]
                     if case.known else [])
        for name, case in cases.items()
    ]  # fmt: skip


@pytest.mark.timeout(TIME_LIMIT_S * 2)
@pytest.mark.parametrize("case", params(CASES))
def test_hostile_input(case: Case, places: tuple[Path, Path, Path]) -> None:
    run_case(case, places, in_process)


CLI_CASES = {name: case for name, case in CASES.items() if case.cli}


@pytest.mark.timeout(TIME_LIMIT_S * 2)
@pytest.mark.parametrize("case", params(CLI_CASES))
def test_hostile_input_through_the_command(case: Case, places: tuple[Path, Path, Path]) -> None:
    run_case(case, places, as_process)


def test_every_family_runs_through_the_command() -> None:
    families = {name.split("/")[0] for name in CASES}
    assert families == {name.split("/")[0] for name in CLI_CASES}
