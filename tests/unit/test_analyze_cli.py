"""`diag analyze` via click's CliRunner: exit codes, one-line errors, formats, --out, --config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.cli.main import main


def analyze(*args: str):
    return CliRunner().invoke(main, ["analyze", *args])


def assert_fatal(result, path: Path | str, reason: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"diag: error: {path}: ")
    assert reason in result.stderr


# --- unusable input: exit 2, one line naming the file ------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    assert_fatal(analyze(str(tmp_path / "nope")), tmp_path / "nope", "no such file or directory")


def test_file_instead_of_folder(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text("{}\n")
    assert_fatal(analyze(str(tmp_path / "x.jsonl")), tmp_path / "x.jsonl", "not a run directory")


def test_empty_folder(tmp_path: Path) -> None:
    assert_fatal(analyze(str(tmp_path)), tmp_path, "neither manifest.json nor Kineto traces")


def test_a_folder_of_traces_a_killed_job_left_says_what_each_file_is(tmp_path: Path) -> None:
    """A job killed while its profiler wrote leaves empty or cut-short files: the one line
    says so, file by file, not only that the folder holds no trace."""
    import gzip

    (tmp_path / "rank-0.json.gz").write_bytes(b"")
    (tmp_path / "rank-1.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}' * 50)[:30])
    (tmp_path / "rank-2.json").write_text("[1, 2]")
    (tmp_path / "rank-3.json").write_text("{}")
    reason = ("its 4 JSON file(s) hold no trace: rank-0.json.gz (empty), rank-1.json.gz (a "
              "gzip cut short or corrupt), rank-2.json (not a JSON object) and 1 more")  # fmt: skip
    assert_fatal(analyze(str(tmp_path)), tmp_path, reason)


def test_folder_of_files_named_like_traces_that_are_not(tmp_path: Path) -> None:
    (tmp_path / "w_1.pt.trace.json").write_text("{}")
    reason = "a trace folder is read as one when its files hold traceEvents"
    assert_fatal(analyze(str(tmp_path)), tmp_path, reason)


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ("", "not valid JSON"),
        ('{"schema": "diag.run/9", "world_size": 1}', "schema is 'diag.run/9'"),
        ('{"schema": "diag.run/1", "world_size": 0}', "world_size is 0"),
        ('{"schema": "diag.run/1", "world_size": 1, "groups": {"dp": 3}}', "malformed field"),
    ],
)
def test_bad_manifest(runs, manifest: str, reason: str) -> None:
    run_dir = runs.write({0: runs.simple_rank()}, manifest)
    assert_fatal(analyze(str(run_dir)), run_dir / "manifest.json", reason)


def test_no_rank_files(runs) -> None:
    run_dir = runs.write({}, runs.manifest(2))
    assert_fatal(analyze(str(run_dir)), run_dir, "no rank files")


def test_missing_config(golden_dp2: Path, tmp_path: Path) -> None:
    config = tmp_path / "rules.toml"
    assert_fatal(analyze(str(golden_dp2), "--config", str(config)), config, "no such file")


def test_invalid_config(golden_dp2: Path, tmp_path: Path) -> None:
    config = tmp_path / "rules.toml"
    config.write_text("[rules\nmax = ")
    assert_fatal(analyze(str(golden_dp2), "--config", str(config)), config, "not valid TOML")


def test_unwritable_out(golden_dp2: Path, tmp_path: Path) -> None:
    out = tmp_path / "no-such-dir" / "report.json"
    assert_fatal(analyze(str(golden_dp2), "--out", str(out)), out, "cannot write")


def test_bad_format_is_a_usage_error(golden_dp2: Path) -> None:
    assert analyze(str(golden_dp2), "--format", "pdf").exit_code == 2


# --- partial input: exit 0, the report says what was skipped -------------------------------------


def test_truncated_last_line(runs) -> None:
    run_dir = runs.write({0: runs.simple_rank(), 1: [*runs.simple_rank(), '{"kind": "st']})
    result = analyze(str(run_dir))
    assert result.exit_code == 0, result.output
    assert "rank-00001.jsonl line 10: not valid JSON (truncated?), skipped" in result.stdout


def test_missing_rank_file(runs) -> None:
    run_dir = runs.write({0: runs.simple_rank()}, runs.manifest(2))
    result = analyze(str(run_dir))
    assert result.exit_code == 0, result.output
    # the headline counts the ranks analysed, and the reason is right under it (issue 42)
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "test-run  1 of 2 ranks (dp=2; rank 1 not analysed: see input)  2 steps"
    )
    assert lines[1:3] == [
        "input problems:",
        "  - rank-00001.jsonl: missing (rank 1 of 2 not analysed)",
    ]


def test_nan_times(runs) -> None:
    bad = '{"kind": "step", "step": 3, "t0": NaN, "t1": 5}'
    run_dir = runs.write({0: [*runs.simple_rank(), bad]}, runs.manifest(1))
    result = analyze(str(run_dir), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["skipped"] == [
        "rank-00000.jsonl: 1 record skipped (step record with null or non-finite t0/t1)"
    ]


# --- formats and --out ----------------------------------------------------------------------------


def test_text(golden_dp2: Path) -> None:
    result = analyze(str(golden_dp2))
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "dp2-golden  2 ranks (dp=2)  2 steps (1-2; warm-up step 0 excluded)  step 0.11 s per "
        "rank (job-wide 0.115 s)  18.2k tokens/s  comm 37% (exposed 19%, 49% of it hidden)"
    )
    text = result.stdout
    assert "busy" in text and "idle" in text and "busbw GB/s" in text and "7.25 MiB" in text
    assert "n/a" in text  # fragmentation is null on CPU, never 0
    assert "skipped:" not in text


def test_json_follows_the_contract(golden_dp2: Path) -> None:
    result = analyze(str(golden_dp2), "--format", "json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["schema"] == "diag.report/1"
    assert set(report) == {
        "schema", "run", "summary", "ranks", "collectives", "memory", "experts", "findings",
        "skipped", "attribution",
    }  # fmt: skip
    attribution = report["attribution"]
    assert {"measured_step_s", "replayed_step_s", "replay_error", "ideal_step_s", "causes",
            "waits"} <= set(attribution)  # fmt: skip
    assert attribution["replay_error"] <= 0.05
    assert set(report["run"]) == {
        "run_id", "trainer", "world_size", "backend", "device_type", "layout", "model", "status",
        "steps_completed", "injections", "groups",
    }  # fmt: skip
    summary_keys = {"step_time_s", "tokens_per_s", "comm_share", "exposed_comm_share",
                    "bubble_fraction", "bubble_theory", "busy_imbalance"}  # fmt: skip
    assert summary_keys <= set(report["summary"])
    assert {"rank", "busy_s", "comm_s", "idle_s"} <= set(report["ranks"][0])
    collective_keys = {"op", "group", "tag", "count", "bytes", "expected_bytes", "ratio",
                       "busbw_GBps"}  # fmt: skip
    assert collective_keys <= set(report["collectives"][0])
    broadcast = next(c for c in report["collectives"] if c["op"] == "broadcast")
    assert broadcast["tag"] is None and broadcast["expected_bytes"] is None
    assert report["memory"][0]["fragmentation"] is None
    assert report["experts"] == [] and report["findings"] == [] and report["skipped"] == []
    assert "NaN" not in result.stdout


def test_markdown(golden_dp2: Path) -> None:
    result = analyze(str(golden_dp2), "--format", "markdown")
    assert result.exit_code == 0
    assert result.stdout.startswith("# diag report: dp2-golden")
    assert "| rank | host | steps |" in result.stdout and "|---|" in result.stdout


def test_html_is_self_contained_and_escaped(runs) -> None:
    manifest = runs.manifest(1, run_id="<script>alert(1)</script>")
    run_dir = runs.write({0: runs.simple_rank()}, manifest)
    result = analyze(str(run_dir), "--format", "html")
    assert result.exit_code == 0
    assert result.stdout.startswith("<!doctype html>")
    assert "<script>" not in result.stdout and "&lt;script&gt;" in result.stdout
    assert "http" not in result.stdout  # nothing loaded from elsewhere


def test_out_writes_the_file_and_infers_the_format(golden_dp2: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = analyze(str(golden_dp2), "--out", str(out))
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(out.read_text())["run"]["run_id"] == "dp2-golden"
    text_out = tmp_path / "report.out"
    assert analyze(str(golden_dp2), "--out", str(text_out), "--format", "text").exit_code == 0
    assert text_out.read_text().startswith("dp2-golden  2 ranks")


def test_valid_config_is_accepted(golden_dp2: Path, tmp_path: Path) -> None:
    config = tmp_path / "rules.toml"
    config.write_text("[rules.COM001]\nhigh = 0.5\n")
    assert analyze(str(golden_dp2), "--config", str(config)).exit_code == 0


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ("[rules.XX999]\nhigh = 1\n", "no rule is called 'XX999'"),
        ("[rules.COM001]\nnope = 1\n", "has no threshold 'nope'"),
    ],
)
def test_config_naming_an_unknown_rule_or_threshold_exits_2(
    golden_dp2: Path, tmp_path: Path, toml: str, says: str
) -> None:
    config = tmp_path / "rules.toml"
    config.write_text(toml)
    result = analyze(str(golden_dp2), "--config", str(config))
    assert result.exit_code == 2 and says in result.output and str(config) in result.output


def test_main_is_a_plain_group() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0 and "analyze" in result.stdout


def test_thresholds_come_from_pyproject_when_no_config_is_given(
    golden_dp2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.diag.rules.COM001]\nnope = 1\n")
    result = analyze(str(golden_dp2))
    assert result.exit_code == 2 and "pyproject.toml [tool.diag]" in result.output
    (tmp_path / "pyproject.toml").write_text(
        "[tool.diag.rules.COM001]\nmedium = 0.01\nhigh = 0.02\n"
    )
    report = json.loads(analyze(str(golden_dp2), "--format", "json").output)
    com001 = [f for f in report["findings"] if f["rule"] == "COM001"]
    assert com001 and com001[0]["severity"] == "high"  # 19% exposed against a 2% limit


def test_text_report_of_many_ranks_shows_the_blamed_rank_first(tmp_path: Path) -> None:
    from benchmarks.synthetic_run import write_synthetic_run
    from diag.api import analyze_path
    from diag.outputs.report import TEXT_MAX_ROWS, render_text

    run_dir = write_synthetic_run(tmp_path / "run", ranks=48, steps=8, straggler_rank=37)
    text = render_text(analyze_path(run_dir))
    lines = text.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("ranks ("))
    assert "blamed ranks first" in lines[title]
    assert lines[title + 2].split()[0] == "37"  # after the header row
    assert f"... {48 - TEXT_MAX_ROWS} more rows" in text
