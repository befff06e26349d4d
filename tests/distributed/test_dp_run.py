"""The DP reference trainer under torchrun: bytes against the ledger, stragglers, SIGKILL."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from collectors.writer import FORMAT_ENV
from diag.api import analyze_path
from diag.cli.launch import torchrun_command
from diag.contract import ledger
from diag.metrics import compute_metrics
from diag.read.load import load_run
from reference_runs.model import GPT, GPTConfig, count_params
from tests.distributed.test_rules_e2e_speed import STRAGGLER_4

pytestmark = pytest.mark.dist


def test_allreduce_bytes_per_step_match_the_ledger(tmp_path: Path, run_dp) -> None:
    # Small buckets (several per step) and accumulation over 2 micro-batches (one sync a step).
    # through `diag run` itself (preflight, torchrun, the manifest's command)
    run_dp(tmp_path, "--steps", "3", "--bucket-mb", "0.25", "--grad-accum", "2", real=True)
    run = load_run(tmp_path)
    params = count_params(GPT(GPTConfig()))
    expected = ledger.dp_grad_payload_bytes(params, grad_dtype_bytes=4)  # accumulation or not

    grads = run.comms[run.comms["tag"] == "grad"]
    assert (grads["op"] == "all_reduce").all() and (grads["group"] == "dp").all()
    per_step = grads.groupby(["rank", "step"])["bytes"].sum()
    assert len(per_step) == 2 * 3
    # really several buckets (DDP rebuilds its buckets after the first step)
    assert (grads[grads["step"] > 0].groupby(["rank", "step"]).size() > 1).all()
    for measured in per_step:
        assert measured == pytest.approx(expected, rel=0.01)
    assert run.manifest.layout.grad_accum == 2
    assert run.manifest.status == "complete" and run.manifest.steps_completed == 3
    assert run.manifest.command.startswith("diag run dp --nproc=2 --steps 3")

    metrics = compute_metrics(run)
    row = metrics.collectives[metrics.collectives["tag"] == "grad"].iloc[0]
    assert row["ratio"] == pytest.approx(1.0, rel=0.01)
    assert row["busbw_GBps"] > 0


def test_straggler_stands_out_and_the_others_wait(shared_run) -> None:
    # test_rules_e2e_speed.py's run: 4 ranks of a small model, rank 1 sleeping 150 ms a step
    delay_ms = 150
    assert f"straggler:rank=1,ms={delay_ms}" in STRAGGLER_4
    ranks = compute_metrics(load_run(shared_run("dp", *STRAGGLER_4, nproc=4))).ranks
    ranks = ranks.set_index("rank")
    steps = ranks.loc[1, "steps"]
    others = ranks.drop(index=1)

    # Rank 1's compute carries the injected sleep; the others wait for it in the all-reduce.
    # (4 ranks share 2 cores: while rank 1 sleeps the others compute faster, so only part of
    # the injected time shows as a difference.)
    injected_s = steps * delay_ms / 1e3
    assert ranks.loc[1, "busy_s"] > others["busy_s"].max() + 0.3 * injected_s
    assert others["exposed_comm_s"].min() > ranks.loc[1, "exposed_comm_s"] + 0.3 * injected_s


def _steps_written(path: Path) -> int:
    if not path.exists():
        return 0
    return sum('"kind":"step"' in line for line in path.read_text().splitlines())


def test_sigkill_of_one_rank_leaves_every_flushed_step_analysable(tmp_path: Path) -> None:
    """JSON lines (the Arrow twin of this test: tests/unit/test_arrow_writer.py)."""
    cmd = torchrun_command("reference_runs.dp", ["--steps", "500", "--out", str(tmp_path)], 2)
    env = {**os.environ, FORMAT_ENV: "jsonl"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    victim = tmp_path / "rank-00001.jsonl"
    try:
        deadline = time.monotonic() + 120
        while _steps_written(victim) < 4:
            assert time.monotonic() < deadline, "the run never wrote 4 steps"
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        meta = json.loads(victim.read_text().splitlines()[0])
        os.kill(meta["pid"], signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    written = {r: _steps_written(tmp_path / f"rank-0000{r}.jsonl") for r in (0, 1)}

    run = load_run(tmp_path)
    # rank 0 either saw the collective fail (and closed the run as failed) or was torn down
    assert run.manifest.status in ("failed", "running")
    for rank, count in written.items():
        assert (run.steps["rank"] == rank).sum() == count >= 4
    metrics = compute_metrics(run)
    assert sorted(metrics.ranks["rank"]) == [0, 1]
    assert metrics.summary["step_time_s"] > 0


def test_slow_comm_and_leak_injections_show_where_they_belong(tmp_path: Path, run_dp) -> None:
    delay_ms, leak_mib = 80, 4
    run_dp(
        tmp_path,
        "--steps",
        "4",
        "--gpus-per-node",
        "1",
        "--inject",
        f"slow-comm:ms={delay_ms},group=dp",
        "--inject",
        f"leak:mb={leak_mib}",
    )
    run = load_run(tmp_path)
    assert [r.host for r in run.manifest.ranks] == ["node0", "node1"]  # virtual hosts
    metrics = compute_metrics(run)

    # The extra latency is communication the ranks wait for, not compute.
    for _, rank in metrics.ranks.iterrows():
        assert rank["exposed_comm_s"] / rank["steps"] > 0.8 * delay_ms / 1e3

    # The leaked graphs hold their tensors for backward: activations grow by the leak each
    # measured step (steps 0-2 are always measured), and so does the process's memory.
    memory = metrics.memory_steps[metrics.memory_steps["rank"] == 0].sort_values("step")
    activations = memory["activations"].dropna().tolist()
    growth = [b - a for a, b in itertools.pairwise(activations)]
    assert len(growth) >= 2 and all(g == leak_mib * 2**20 for g in growth)
    assert memory["host_rss"].iloc[-1] > memory["host_rss"].iloc[0]


def test_profile_steps_capture_a_kineto_window_read_with_the_run(tmp_path: Path, run_dp) -> None:
    run_dp(tmp_path, "--steps", "4", "--profile-steps", "1:3")
    traces = sorted((tmp_path / "traces").glob("rank*.pt.trace.json.gz"))
    assert [t.name.split(".")[0] for t in traces] == ["rank0", "rank1"]
    report = analyze_path(tmp_path)
    window = report["traces"]
    assert [r["rank"] for r in window["ranks"]] == [0, 1]
    assert all(r["steps"] == 2 for r in window["ranks"])  # ProfilerStep#1 and #2
    assert "all_reduce" in {c["op"] for c in window["collectives"]}  # gloo worker events
    assert report["summary"]["steps_analysed"] == 3  # the run's own records, 4 steps - warm-up
