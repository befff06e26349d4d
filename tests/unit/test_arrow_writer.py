"""Arrow rank files written by real writers: the collectors inside a torchrun job (killed with
SIGKILL mid-run), the simulator, and `diag convert`; each read back as its JSONL twin reads."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import collectors.safety
from collectors import Recorder
from collectors.writer import FORMAT_ENV, open_rank_writer
from diag.cli.launch import torchrun_command
from diag.cli.main import main
from diag.rankfile.convert import rank_file, rank_records
from diag.read.load import load_run, read_rank_file


def _steps_in(path: Path) -> int:
    """Step records readable in a rank file now (the file may be cut mid-write)."""
    if not path.exists():
        return 0
    return len(read_rank_file(0, path).columns["step"]["step"])


def test_sigkill_of_one_rank_loses_no_flushed_step(tmp_path: Path) -> None:
    """A 2-rank gloo DP run writing Arrow; rank 1 killed once it has flushed 4 steps. Every
    step either rank flushed is read back, and the cut, if any, is noted, not fatal."""
    cmd = torchrun_command("reference_runs.dp", ["--steps", "400", "--out", str(tmp_path)], 2)
    env = {**os.environ, FORMAT_ENV: "arrow", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    victim = tmp_path / "rank-00001.arrows"
    try:
        deadline = time.monotonic() + 120
        while _steps_in(victim) < 4:
            assert time.monotonic() < deadline, "the run never wrote 4 steps"
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        other = read_rank_file(1, victim)
        assert other.skipped == [] or "incomplete" in other.skipped[0]
        os.kill(_pid_of(victim), signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    written = {rank: _steps_in(tmp_path / f"rank-{rank:05d}.arrows") for rank in (0, 1)}
    assert not list(tmp_path.glob("rank-*.jsonl"))
    run = load_run(tmp_path)
    assert run.manifest.status in ("failed", "running")
    for rank, count in written.items():
        steps = sorted(run.steps.loc[run.steps["rank"] == rank, "step"])
        assert count >= 4 and steps == list(range(count)), (rank, count, steps)
    fatal = [note for note in run.skipped if "not analysed" in note]
    assert fatal == []


def _pid_of(path: Path) -> int:
    """The writer's pid, from the meta record (a JSON line in the first batch)."""
    from diag.rankfile import arrow_format

    notes: list[str] = []
    meta = next(r for r in arrow_format.records(path.read_bytes(), path.name, notes)
                if r.get("kind") == "meta")  # fmt: skip
    return int(meta["pid"])


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small 3D run (with MoE: every record kind) simulated in both formats (Arrow: the
    default, no --format)."""
    root = tmp_path_factory.mktemp("sim")
    args = ["simulate", "--layout", "dp=2,tp=2,pp=2,ep=2", "--experts", "4",
            "--microbatches", "4", "--steps", "6", "--gpus-per-node", "4"]  # fmt: skip
    runs = {}
    for fmt in ("arrow", "jsonl"):
        out = root / fmt
        chosen = [] if fmt == "arrow" else ["--format", fmt]
        result = CliRunner().invoke(main, [*args, "--out", str(out), *chosen])
        assert result.exit_code == 0, result.output
        runs[fmt] = out
    return runs


def _report(run: Path) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["analyze", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    report["run"].pop("run_id", None)
    return report


def test_simulated_arrow_run_has_the_jsonl_runs_report(simulated: dict[str, Path]) -> None:
    arrow, jsonl = simulated["arrow"], simulated["jsonl"]
    assert sorted(p.name for p in arrow.glob("rank-*"))[0] == "rank-00000.arrows"
    arrow_bytes = sum(p.stat().st_size for p in arrow.glob("rank-*"))
    jsonl_bytes = sum(p.stat().st_size for p in jsonl.glob("rank-*"))
    assert arrow_bytes < jsonl_bytes
    tables = load_run(arrow), load_run(jsonl)
    for name in ("steps", "spans", "comms", "memory", "experts", "events"):
        a, j = (getattr(t, name) for t in tables)
        assert len(a) == len(j) > 0, name
        assert a.equals(j), name
    assert _report(arrow) == _report(jsonl)


def test_convert_both_ways_keeps_the_tables(simulated: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(simulated["jsonl"], run)
    before = load_run(run)
    for fmt, suffix in (("arrow", ".arrows"), ("jsonl", ".jsonl")):
        result = CliRunner().invoke(main, ["convert", str(run), "--to", fmt])
        assert result.exit_code == 0, result.output
        assert {p.suffix for p in run.glob("rank-*")} == {suffix}
        after = load_run(run)
        for name in ("steps", "comms", "memory", "experts"):
            assert getattr(after, name).equals(getattr(before, name)), (fmt, name)
        # spans and events: the same rows, in kind order within each step for Arrow
        for name, keys in (("spans", ["rank", "step", "t0", "phase"]),
                           ("events", ["rank", "step", "name"])):  # fmt: skip
            a = getattr(after, name).sort_values(keys, kind="stable").reset_index(drop=True)
            b = getattr(before, name).sort_values(keys, kind="stable").reset_index(drop=True)
            assert a.astype(str).equals(b.astype(str)), (fmt, name)


def test_arrow_is_the_default_and_jsonl_stays_a_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(FORMAT_ENV, raising=False)
    tmp_path.mkdir(exist_ok=True)

    def name(**options: Any) -> str:
        writer = open_rank_writer(tmp_path, 3, **options)
        writer.close()
        return writer.path.name

    assert name() == "rank-00003.arrows"
    assert name(format="jsonl") == "rank-00003.jsonl"
    monkeypatch.setenv(FORMAT_ENV, "jsonl")
    assert name() == "rank-00003.jsonl"
    assert name(format="arrow") == "rank-00003.arrows"  # a format given wins over the env
    monkeypatch.setenv(FORMAT_ENV, " ")
    assert name() == "rank-00003.arrows"
    monkeypatch.setenv(FORMAT_ENV, "parquet")  # logged once, not fatal: the default written
    monkeypatch.setattr(collectors.safety, "_reported", set())
    with caplog.at_level(logging.WARNING, logger="collectors"):
        assert name() == "rank-00003.arrows"
    assert "DIAG_RANK_FORMAT='parquet', expected one of arrow, jsonl" in caplog.text
    with pytest.raises(ValueError, match=r"rank file format 'parquet'"):
        name(format="parquet")
    monkeypatch.delenv(FORMAT_ENV)
    for fmt, suffix in ((None, ".arrows"), ("jsonl", ".jsonl")):
        run = tmp_path / f"recorder-{fmt}"
        rec = Recorder(run, format=fmt)  # type: ignore[arg-type]
        with rec.step(tokens=1):
            pass
        rec.close()
        assert [p.suffix for p in run.glob("rank-*")] == [suffix]
        assert len(load_run_records(run)) == 1


def load_run_records(run: Path) -> list[dict[str, Any]]:
    path = rank_file(run, 0)
    assert path is not None
    return [r for r in rank_records(path) if r["kind"] == "step"]


def test_convert_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["convert", str(tmp_path), "--to", "arrow"])
    assert result.exit_code == 2
    assert result.stderr.startswith("diag: error: ") and "manifest.json" in result.stderr


def test_overhead_benchmark_keeps_its_own_options_from_torchrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun read the benchmark's `--nproc 2` as its ambiguous `--nproc-per-node`: the
    launcher's own options never reach the ranks' command line."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "collector_overhead.py"
    spec = importlib.util.spec_from_file_location("collector_overhead", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "collector_overhead", bench)  # its dataclasses look it up
    spec.loader.exec_module(bench)
    argv = ["--nproc", "2", "--steps", "8", "--nproc=3", "--format", "arrow", "--block", "2"]
    assert bench.rank_argv(argv) == ["--steps", "8", "--block", "2"]
    assert bench.parse_args(argv).format == "arrow"
