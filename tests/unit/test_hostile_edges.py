"""Issue 42: the edges of the command line and what hostile names, files and settings make of
every command, each with the exact exit code and line.

- odd input answered plainly: a check with nothing to check, a run without a usable step;
- names with terminal escapes, newlines, backticks and markup in the text and Markdown
  reports and in the one-line error (diag/outputs/escape.py);
- a lone surrogate in a record's label or the manifest's host name;
- a FIFO where any command reads (analyze, export, compare, check, convert, --config, --plan);
- a deeply nested config file, given or in the current folder's pyproject.toml;
- `diag convert`'s temporaries; a `.diag-cache` that is a link elsewhere; `--hta` beside a
  compression bomb.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from diag.cli.check import NOTHING_TO_CHECK
from diag.cli.main import main
from diag.read import cache
from diag.read.kineto.hta_bridge import accepted_traces
from tests.conftest import RunWriter
from tests.unit.test_kineto import _step_events, _trace

ROOT = Path(__file__).parents[2]
TIME_LIMIT_S = 60


def cli(*args: Any) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def as_process(*args: Any, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diag", *map(str, args)],
        capture_output=True, text=True, timeout=TIME_LIMIT_S, cwd=cwd or ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def one_error_line(stderr: str, path: Path | str) -> str:
    """The one-line error's reason, after checking it is one line naming `path`."""
    assert "Traceback" not in stderr, stderr[-2000:]
    assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr[-2000:]
    prefix = f"diag: error: {path}: "
    assert stderr.startswith(prefix), stderr
    return stderr[len(prefix) : -1]


@pytest.fixture
def runs(tmp_path: Path) -> RunWriter:
    return RunWriter(tmp_path)


def good_run(runs: RunWriter, name: str = "run", **manifest: Any) -> Path:
    rows = [*runs.simple_rank(), runs.comm(1, 60, 90)]
    return runs.write({0: rows, 1: list(rows)}, {**runs.manifest(2), **manifest}, name)


# --- odd input answered plainly -------------------------------------------------------------------


def test_check_with_nothing_to_check_says_so_and_exits_2(runs: RunWriter) -> None:
    run = good_run(runs)
    result = cli("check", run)
    assert result.exit_code == 2 and result.stdout == ""
    assert one_error_line(result.stderr, run) == NOTHING_TO_CHECK
    assert NOTHING_TO_CHECK.startswith("nothing to check: give a limit (--max-comm-share")
    # a limit, a baseline or a plan is something to check
    assert cli("check", run, "--max-comm-share", "0.99").stdout == f"ok: {run}: 1 checks hold\n"


def test_a_run_without_a_usable_rank_exits_2_with_the_reason(runs: RunWriter) -> None:
    run = runs.write({0: ["\x00garbage", "{not json"], 1: ['{"kind": "st']}, runs.manifest(2))
    result = cli("analyze", run)
    assert result.exit_code == 2 and result.stdout == ""
    assert one_error_line(result.stderr, run) == (
        "no rank has a usable step record (rank-00000.jsonl: 2 lines not valid JSON "
        "(truncated?), skipped (first at line 1); rank-00001.jsonl line 1: not valid JSON "
        "(truncated?), skipped)"
    )


def test_missing_ranks_are_counted_in_the_headline_and_said_under_it(runs: RunWriter) -> None:
    rows = runs.simple_rank()
    run = runs.write({0: rows, 1: list(rows), 3: list(rows)}, runs.manifest(4))
    lines = cli("analyze", run).stdout.splitlines()
    assert lines[0].startswith(
        "test-run  3 of 4 ranks (dp=4; rank 2 not analysed: see input)  2 steps"
    )
    assert lines[1:3] == [
        "input problems:",
        "  - rank-00002.jsonl: missing (rank 2 of 4 not analysed)",
    ]
    markdown = cli("analyze", run, "--format", "markdown").stdout.splitlines()
    assert markdown[4:7] == [
        "Input problems:",
        "",
        "- rank-00002.jsonl: missing (rank 2 of 4 not analysed)",
    ]


# --- names per output format ----------------------------------------------------------------------

FORGED = "\nFORGED: all ranks healthy"
ESCAPES = "\x1b[2J\x1b]8;;http://x\x07link\x1b]8;;\x07\x9b31m\u202e"


def hostile_names_run(runs: RunWriter) -> Path:
    group = f"dp{FORGED}{ESCAPES}`<img src=x onerror=alert(1)>`"
    rows = [*runs.simple_rank(), runs.comm(1, 60, 90, group=group, tag="t`</code><b>x")]
    manifest = runs.manifest(2, run_id=f"job{FORGED}{ESCAPES}`<script>`")
    manifest["ranks"][1]["host"] = f"host{FORGED}{ESCAPES}"
    return runs.write({0: rows, 1: list(rows)}, manifest)


def test_text_report_escapes_every_name(runs: RunWriter) -> None:
    text = cli("analyze", hostile_names_run(runs)).stdout
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "\u202e" not in text
    assert not any(line.startswith("FORGED") for line in text.splitlines())
    assert text.startswith("job\\nFORGED: all ranks healthy\\x1b[2J")
    assert "host\\nFORGED: all ranks healthy\\x1b[2J" in text
    assert "\\u202e" in text


def test_markdown_report_keeps_names_inside_their_markup(runs: RunWriter) -> None:
    text = cli("analyze", hostile_names_run(runs), "--format", "markdown").stdout
    assert "\x1b" not in text and "\u202e" not in text
    assert not any(line.startswith("FORGED") for line in text.splitlines())
    lines = text.splitlines()
    assert lines[0].startswith("# diag report: job\\\\nFORGED: all ranks healthy")
    headline = lines[2]  # a code span (markup in it is text) fenced longer than any backtick run
    fence = headline[: headline.index("j")].rstrip()
    assert fence == "``" and headline.endswith(fence) and headline.count("``") == 2
    rest = "\n".join(lines[:2] + lines[3:])
    assert "<img" not in rest and "<script>" not in rest and "<b>" not in rest
    assert "&lt;img src=x onerror=alert(1)&gt;" in text  # in a table cell: text, not markup


def test_a_newline_in_a_file_name_stays_in_the_one_line_error(tmp_path: Path) -> None:
    folder = tmp_path / "a\nFORGED: ok\x1b[2J"
    folder.mkdir()
    (folder / "manifest.json").write_text("{not json")
    result = as_process("analyze", folder)
    assert result.returncode == 2 and result.stdout == ""
    reason = one_error_line(result.stderr, tmp_path / "a\\nFORGED: ok\\x1b[2J" / "manifest.json")
    assert reason.startswith("not valid JSON")


# --- lone surrogates ------------------------------------------------------------------------------


def test_a_lone_surrogate_in_a_label_skips_the_record(runs: RunWriter) -> None:
    rows = [*runs.simple_rank(), runs.comm(1, 60, 90, group="dp\ud800")]
    run = runs.write({0: runs.simple_rank(), 1: rows}, runs.manifest(2))
    for fmt in ("json", "text", "markdown"):
        result = as_process("analyze", run, "--format", fmt)
        assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(as_process("analyze", run, "--format", "json").stdout)
    assert report["skipped"] == [
        "rank-00001.jsonl: 1 record skipped (comm record with a string that is not Unicode text "
        "(a lone surrogate))"
    ]


def test_a_lone_surrogate_in_a_host_name_is_replaced(runs: RunWriter) -> None:
    run = good_run(runs)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["ranks"][1]["host"] = "h\ud800x"
    (run / "manifest.json").write_text(json.dumps(manifest))  # ASCII: the \ud800 escape
    for command in (["analyze", run], ["analyze", run, "--format", "json"],
                    ["export", run, "--perfetto", run.parent / "t.json.gz"],
                    ["check", run, "--max-comm-share", "1"]):  # fmt: skip
        result = as_process(*command)
        assert result.returncode == 0, (command, result.stderr[-2000:])
    report = json.loads(as_process("analyze", run, "--format", "json").stdout)
    assert report["ranks"][1]["host"] == "h\ufffdx"


# --- special files where every command reads ------------------------------------------------------


@pytest.mark.timeout(TIME_LIMIT_S * 4)
def test_a_fifo_hangs_no_command(runs: RunWriter, tmp_path: Path) -> None:
    run = good_run(runs)
    (run / "rank-00001.jsonl").unlink()
    os.mkfifo(run / "rank-00001.jsonl")
    fifo_note = "rank-00001.jsonl: cannot read (a FIFO, not a regular file), rank 1 not analysed"
    report = json.loads(as_process("analyze", run, "--format", "json").stdout)
    assert fifo_note in report["skipped"]
    assert as_process("export", run, "--perfetto", tmp_path / "t.json").returncode == 0
    assert as_process("compare", run, good_run(runs, "other")).returncode == 0
    assert as_process("check", run, "--max-comm-share", "1").returncode == 0
    converted = as_process("convert", run, "--to", "arrow")
    assert converted.returncode == 0
    assert converted.stderr == (
        "diag: note: rank-00001.jsonl: cannot read (a FIFO, not a regular file), not converted\n"
    )
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args in (["--config", fifo], ["--plan", fifo]):
        result = as_process("check", run, "--max-comm-share", "1", *args)
        assert result.returncode == 2
        assert "a FIFO, not a regular file" in one_error_line(result.stderr, fifo)
    (run / "manifest.json").unlink()
    os.mkfifo(run / "manifest.json")
    for command in (["analyze", run], ["export", run, "--perfetto", tmp_path / "t.json"],
                    ["check", run, "--max-comm-share", "1"], ["convert", run, "--to", "jsonl"],
                    ["compare", run, run]):  # fmt: skip
        result = as_process(*command)
        assert result.returncode == 2, command
        assert one_error_line(result.stderr, run / "manifest.json") == (
            "cannot read (a FIFO, not a regular file)"
        )


# --- config files ---------------------------------------------------------------------------------

DEEP_TOML = "x = " + "[" * 5000 + "]" * 5000 + "\n"


def test_a_deeply_nested_config_is_one_line(runs: RunWriter, tmp_path: Path) -> None:
    run = good_run(runs)
    config = tmp_path / "deep.toml"
    config.write_text(DEEP_TOML)
    result = as_process("analyze", run, "--config", config)
    assert result.returncode == 2 and result.stdout == ""
    assert one_error_line(result.stderr, config) == "not valid TOML (nested too deeply to parse)"
    shallow = tmp_path / "shallow.toml"
    shallow.write_text("x = " + "[" * 40 + "]" * 40 + "\n")
    result = as_process("analyze", run, "--config", shallow)
    assert one_error_line(result.stderr, shallow) == (
        "nested deeper than 32 levels (thresholds are two)"
    )
    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / "pyproject.toml").write_text("[tool.diag]\n" + DEEP_TOML)
    result = as_process("analyze", run, cwd=cwd)
    assert result.returncode == 2
    assert one_error_line(result.stderr, "pyproject.toml") == (
        "not valid TOML (nested too deeply to parse)"
    )


# --- what diag writes -----------------------------------------------------------------------------


def test_convert_never_writes_through_a_planted_link_or_opens_a_fifo(
    runs: RunWriter, tmp_path: Path
) -> None:
    run = good_run(runs)
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    os.mkfifo(run / ".rank-00000.arrows.tmp")  # the names the temporaries had
    (run / ".rank-00001.arrows.tmp").symlink_to(outside)
    result = as_process("convert", run, "--to", "arrow")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"converted 2 rank files of {run} to arrow\n"
    assert outside.read_bytes() == b"keep"
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == [
        "manifest.json", "rank-00000.arrows", "rank-00001.arrows",
    ]  # fmt: skip


def test_a_linked_cache_folder_is_not_followed(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    for rank in (0, 1):
        trace = _trace(rank, events=_step_events())
        (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(trace))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / cache.CACHE_DIR).symlink_to(elsewhere)
    env_cache = tmp_path / "xdg"
    result = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(folder), "--format", "json"],
        capture_output=True, text=True, timeout=TIME_LIMIT_S, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(env_cache)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert list(elsewhere.iterdir()) == []
    assert json.loads(result.stdout)["cache_notes"] == [
        f"{folder / cache.CACHE_DIR}: a symbolic link, not followed (the user's cache is used)"
        " - ignored, rebuilt"
    ]
    assert any(env_cache.rglob("kineto.json"))  # the user's cache holds the entry instead


def test_hta_is_handed_only_the_traces_diag_accepted(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.pt.trace.json").write_text(json.dumps(_trace(0, events=_step_events())))
    bomb = folder / "rank1.pt.trace.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:  # 65 KiB on disk, 128 MiB inflated
        for _ in range(128):
            fh.write(b" " * 2**20)
    os.mkfifo(folder / "rank2.pt.trace.json")  # not a trace file: never listed
    accepted, notes = accepted_traces(folder)
    assert accepted == [folder / "rank0.pt.trace.json"]
    assert len(notes) == 1
    assert notes[0].startswith(f"{bomb}: refused: inflates past 64 MiB")
    assert notes[0].endswith("; not handed to HTA")


def test_a_followed_rank_file_that_is_a_device_is_noted_once(tmp_path: Path) -> None:
    from diag.rankfile.tail import JsonlTail

    (tmp_path / "rank-00000.jsonl").symlink_to("/dev/zero")
    tail = JsonlTail(tmp_path / "rank-00000.jsonl")
    assert tail.read_new() == [] and tail.read_new() == []
    assert tail.notes == [
        "rank-00000.jsonl: cannot read (a character device, not a regular file), not analysed"
    ]


@pytest.mark.timeout(TIME_LIMIT_S)
def test_the_dashboard_loads_a_run_beside_a_fifo(runs: RunWriter) -> None:
    from dashboard.data import load_runs
    from diag.errors import InputError

    run = good_run(runs)
    (run / "rank-00001.jsonl").unlink()
    os.mkfifo(run / "rank-00001.jsonl")
    (loaded,) = load_runs([run])
    assert loaded.report["summary"]["ranks_analysed"] == 1
    (run / "manifest.json").unlink()
    os.mkfifo(run / "manifest.json")
    with pytest.raises(InputError, match="a FIFO, not a regular file"):
        load_runs([run])
