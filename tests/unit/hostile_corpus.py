"""The hostile-input corpus's shared pieces: the case type, the builders every family uses and
the contract each case is checked against.

Each case builds a small valid run or trace folder in tmp_path and breaks one thing. The contract
(docs/run-format.md, "Limits"; diag/read/load.py): exit 0 with the good ranks analysed and a note in
the report's `skipped`, or exit 2 with one line `diag: error: PATH: reason` naming the file; never a
traceback, within a minute, and nothing written outside the input's `.diag-cache`
(diag/contract/limits.py bounds whatever would size an allocation or a loop). Every case runs in
this process through click's runner; one case a family (`cli=True`) also runs `diag analyze` as a
process.

The families, one test module each: test_hostile_manifest.py, test_hostile_rank_files.py (JSONL
records), test_hostile_run_layout.py (links, folders, rank file names), test_hostile_traces.py
(Kineto trace folders); test_hostile_input.py checks that every family runs through the command.
"""

from __future__ import annotations

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

from diag.cli.main import main
from tests.conftest import RunWriter

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


# --- content and run directories ------------------------------------------------------------------

Text = str | bytes | Callable[[], str | bytes]
"""File content, or what makes it when the case is built (large content is not kept)."""


def as_bytes(text: Text) -> bytes:
    made = text() if callable(text) else text
    return made.encode() if isinstance(made, str) else made


def garbage(size: int) -> bytes:
    return random.Random(12).randbytes(size)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


RUN = "run"
MANIFEST = "run/manifest.json"


def valid_run(root: Path, **manifest: Any) -> Path:
    """A 2-rank run of 3 steps (fwd, bwd, an all-reduce), the manifest's fields replaced."""
    runs = RunWriter(root)
    rows = [*runs.simple_rank(), runs.comm(1, 60, 90), runs.mem(1)]
    return runs.write({0: rows, 1: list(rows)}, {**runs.manifest(2), **manifest}, RUN)


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


Places = tuple[Path, Path, Path]


def make_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Places:
    """The input folder, a working folder (the current one) and a user cache folder."""
    root, cwd, xdg = tmp_path / INPUT, tmp_path / "cwd", tmp_path / "xdg"
    for folder in (root, cwd, xdg):
        folder.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.chdir(cwd)
    return root, cwd, xdg


def run_case(
    case: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    analyze: Callable[[Path], tuple[int, str, str]],
) -> None:
    root, _, xdg = make_places(tmp_path, monkeypatch)
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


def cli_cases(cases: dict[str, Case]) -> dict[str, Case]:
    """The cases that also run `diag analyze` as a process."""
    return {name: case for name, case in cases.items() if case.cli}


FamilyTest = Callable[[Case, Path, pytest.MonkeyPatch], None]


def family_tests(cases: dict[str, Case]) -> tuple[FamilyTest, FamilyTest]:
    """A family module's two tests, to be named `test_...` there: every case analysed in
    this process, and the cases marked `cli` as a `diag analyze` process."""

    @pytest.mark.timeout(TIME_LIMIT_S * 2)
    @pytest.mark.parametrize("case", params(cases))
    def in_this_process(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        run_case(case, tmp_path, monkeypatch, in_process)

    @pytest.mark.timeout(TIME_LIMIT_S * 2)
    @pytest.mark.parametrize("case", params(cli_cases(cases)))
    def through_the_command(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        run_case(case, tmp_path, monkeypatch, as_process)

    return in_this_process, through_the_command
