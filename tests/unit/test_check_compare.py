"""`diag check` (limits, baseline regressions, exit codes) and `diag compare` (scaling sweeps,
before/after pairs) on small RunWriter-built runs."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from diag.cli.main import main

MODEL = {"layers": 2, "hidden": 64, "params": 1000}


def dp_run(runs, name: str, world: int = 2, step_ms: float = 100, comm_ms: float = 20,
           tokens: int = 100, steps: int = 4) -> Path:  # fmt: skip
    """`world` DP ranks: fwd and bwd fill the step up to an all-reduce of `comm_ms` at its end
    (fully exposed), so comm_share = exposed = comm_ms / step_ms."""
    records = {}
    for rank in range(world):
        rows = []
        for s in range(steps):
            t0, compute = s * step_ms, step_ms - comm_ms
            rows += [runs.span(s, "fwd", t0, t0 + compute / 2),
                     runs.span(s, "bwd", t0 + compute / 2, t0 + compute),
                     runs.comm(s, t0 + compute, t0 + step_ms, group_size=world),
                     runs.step(s, t0, t0 + step_ms, tokens=tokens)]  # fmt: skip
        records[rank] = rows
    return runs.write(records, runs.manifest(world, run_id=name, model=MODEL), name=name)


def cli(*args: str | Path):
    return CliRunner().invoke(main, [str(a) for a in args])


def summary(path: Path) -> dict:
    return json.loads(cli("analyze", path, "--format", "json").stdout)["summary"]


# --- diag check ---------------------------------------------------------------------------------


def test_check_passes_within_limits(runs) -> None:
    run = dp_run(runs, "ok", comm_ms=20)
    result = cli("check", run, "--max-comm-share", "0.5", "--max-exposed-comm-share", "0.5")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"ok: {run}: 2 checks hold\n"


def test_check_fails_with_one_line_per_violated_limit(runs) -> None:
    run = dp_run(runs, "chatty", comm_ms=40)
    measured = summary(run)
    assert 0.35 < measured["comm_share"] < 0.45
    result = cli("check", run, "--max-comm-share", "0.3", "--max-exposed-comm-share", "0.3",
                 "--max-bubble", "0.1")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        f"comm_share {measured['comm_share']:.3f} > 0.300 (--max-comm-share)",
        f"exposed_comm_share {measured['exposed_comm_share']:.3f} > 0.300 "
        "(--max-exposed-comm-share)",
    ]
    # a DP run has no bubble: that limit passes, with a note on stderr
    assert "bubble_fraction not measured in this run; --max-bubble not checked" in result.stderr


def test_check_baseline_detects_a_regression(runs) -> None:
    base = dp_run(runs, "base", step_ms=100)
    slow = dp_run(runs, "slow", step_ms=130)
    result = cli("check", slow, "--baseline", base, "--tolerance", "0.1")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "regressed step_time_s", "regressed tokens_per_s",
    ]  # fmt: skip
    assert "0.13 vs baseline 0.1 (+30.0%, tolerance 10%)" in lines[0]
    # within tolerance, and an improvement, both pass
    assert cli("check", slow, "--baseline", base, "--tolerance", "0.5").exit_code == 0
    assert cli("check", base, "--baseline", slow).exit_code == 0


def test_check_limits_from_config(runs, tmp_path: Path) -> None:
    run = dp_run(runs, "chatty", comm_ms=40)
    config = tmp_path / "gate.toml"
    config.write_text("[check]\nmax_comm_share = 0.3\n")
    assert cli("check", run, "--config", config).exit_code == 1
    assert cli("check", run, "--config", config, "--max-comm-share", "0.9").exit_code == 0
    config.write_text("[check]\nmax_comms = 0.3\n")
    result = cli("check", run, "--config", config)
    assert result.exit_code == 2 and result.stderr.startswith(f"diag: error: {config}: ")
    assert "[check] has no setting 'max_comms'" in result.stderr


def test_check_unusable_input_exits_2_with_one_line(runs, tmp_path: Path) -> None:
    run = dp_run(runs, "ok")
    for args, path in [((tmp_path / "nope", "--max-comm-share", "0.5"), tmp_path / "nope"),
                       ((run, "--baseline", tmp_path / "gone"), tmp_path / "gone")]:  # fmt: skip
        result = cli("check", *args)
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith(f"diag: error: {path}: no such file or directory")


def test_check_tolerance_without_baseline_is_a_usage_error(runs) -> None:
    assert cli("check", dp_run(runs, "ok"), "--tolerance", "0.1").exit_code == 2


# --- diag compare -------------------------------------------------------------------------------


def test_compare_falling_sweep_is_pattern_1(runs) -> None:
    two = dp_run(runs, "dp2", world=2, step_ms=100)  # 2 ranks x 100 tokens / 0.1 s = 2k tokens/s
    four = dp_run(runs, "dp4", world=4, step_ms=250)  # 4 x 100 / 0.25 s = 1.6k tokens/s
    result = cli("compare", four, two, "--format", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["kind"] == "sweep" and out["pattern"] == 1
    (step,) = out["sweep"]
    assert (step["world_from"], step["world_to"]) == (2, 4)
    assert step["throughput_falls"]
    assert abs(step["scaling_efficiency"] - (1600 / 2000) / 2) < 1e-9
    text = cli("compare", two, four).stdout
    assert "pattern 1, more GPUs, slower: throughput falls as GPUs are added" in text
    assert "scaling efficiency 40%" in text
    assert text.splitlines()[0].split()[:3] == ["run", "world", "layout"]


def test_compare_growing_sweep_is_not_pattern_1(runs) -> None:
    two = dp_run(runs, "dp2", world=2, step_ms=100)
    four = dp_run(runs, "dp4", world=4, step_ms=110)
    out = json.loads(cli("compare", two, four, "--format", "json").stdout)
    assert out["kind"] == "sweep" and out["pattern"] is None
    assert 0.9 < out["sweep"][0]["scaling_efficiency"] < 0.92


def test_compare_before_after_lists_regressions(runs) -> None:
    before = dp_run(runs, "before", step_ms=100, comm_ms=20)
    after = dp_run(runs, "after", step_ms=140, comm_ms=60)
    result = cli("compare", before, after, "--format", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["kind"] == "before_after"
    regressed = {r["metric"] for r in out["regressions"]}
    assert regressed == {"step_time_s", "tokens_per_s", "comm_share", "exposed_comm_share"}
    quiet = json.loads(cli("compare", before, after, "--tolerance", "5", "--format", "json").stdout)
    assert quiet["regressions"] == [] and "no metric regressed" in quiet["verdict"]
    text = cli("compare", before, after).stdout
    assert f"{after}: step_time_s 0.14 vs 0.1 (+40.0%)" in text


def test_compare_needs_two_runs_and_usable_input(runs, tmp_path: Path) -> None:
    run = dp_run(runs, "ok")
    assert cli("compare", run).exit_code == 2
    result = cli("compare", run, tmp_path / "nope")
    assert result.exit_code == 2 and result.stderr.startswith(f"diag: error: {tmp_path / 'nope'}")


def test_compare_before_after_names_what_it_could_not_compare(runs) -> None:
    before = dp_run(runs, "before", step_ms=100, comm_ms=20)
    after = dp_run(runs, "after", step_ms=100, comm_ms=20)
    out = json.loads(cli("compare", before, after, "--format", "json").stdout)
    # a data-parallel run has no bubble, and these record no memory: not "no regression" there
    assert {"bubble_fraction", "peak_memory_bytes"} <= set(out["not_compared"])
    assert "not compared (unknown in a run)" in out["verdict"]
