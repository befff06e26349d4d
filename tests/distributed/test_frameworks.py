"""The framework collectors with the real libraries on 2 CPU ranks: a Lightning
`Trainer(strategy="ddp", accelerator="cpu", devices=2)` fit (tests/distributed/lightning_job.py)
and a Hugging Face `Trainer` under torchrun (tests/distributed/hf_job.py), each recorded by its
callback and traced by the framework's own profiler route; `diag analyze` reads both."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import diag
from diag.contract.schema import MEMORY_CATEGORIES
from tests.conftest import raw_records

pytestmark = pytest.mark.dist

HERE = Path(__file__).parent


def records(run: Path, rank: int, kind: str) -> list[dict[str, Any]]:
    return [r for r in raw_records(run, rank) if r["kind"] == kind]


def assert_dp_run_recorded(run: Path, steps: int) -> dict[str, Any]:
    """dp=2 inferred, gradient bytes = the ledger, the six memory categories, every phase."""
    report = diag.analyze_path(run)
    assert report["run"]["world_size"] == 2 and report["run"]["layout"]["dp"] == 2
    (grad,) = [c for c in report["collectives"] if c["tag"] == "grad"]
    assert grad["group"] == "dp" and grad["ratio"] == pytest.approx(1.0, rel=0.01)
    for rank in (0, 1):
        assert [s["step"] for s in records(run, rank, "step")] == list(range(steps))
        phases = {s["phase"] for s in records(run, rank, "span")}
        assert {"fwd", "bwd", "opt", "comm_wait"} <= phases
        (first, *_) = records(run, rank, "mem")
        assert set(MEMORY_CATEGORIES) <= set(first)
        for category in ("params", "grads", "optimizer", "activations", "comm_buffers"):
            assert first[category] > 0, category
        assert first["fragmentation"] is None  # CPU: not measurable, never faked
    assert not [f for f in report["findings"] if f["rule"] == "PIT004"]
    return report


def run_job(*command: str, cwd: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


@pytest.fixture(scope="module")
def lightning_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lightning")
    out = tmp_path_factory.mktemp("lightning")
    run_job(sys.executable, str(HERE / "lightning_job.py"), str(out), cwd=out)
    return out


def test_lightning_fit_is_recorded(lightning_out: Path) -> None:
    assert_dp_run_recorded(lightning_out / "run", steps=5)
    assert (
        json.loads((lightning_out / "run" / "manifest.json").read_text())["trainer"] == "lightning"
    )


def test_lightning_profiler_traces_are_read_as_written(lightning_out: Path) -> None:
    """PyTorchProfiler's folder as Lightning writes it: one trace per rank (named
    `fit-trace-RANK-...pt.trace.json`) beside its text summaries."""
    report = diag.analyze_path(lightning_out / "traces")
    assert report["run"]["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["summary"]["step_time_s"] > 0
    collectives = {c["op"]: c for c in report["collectives"]}
    assert collectives["all_reduce"]["group"] == "world"  # DDP's, on the only process group
    assert all(float(c["count"]).is_integer() for c in report["collectives"])


def test_torchtitan_window_folders_are_read(lightning_out: Path, tmp_path: Path) -> None:
    """torchtitan (`--profiling.enable_profiling`) writes `profile_traces/iteration_N/
    rank{R}_trace.json` (torchtitan/tools/profiling.py); the real traces of the Lightning fit,
    laid out so, read as the latest window, with a note naming it."""
    folder = tmp_path / "profile_traces"
    for window in (10, 20):
        for rank in (0, 1):
            (trace,) = (lightning_out / "traces").glob(f"fit-trace-{rank}-*.pt.trace.json")
            target = folder / f"iteration_{window}" / f"rank{rank}_trace.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(trace, target)
    report = diag.analyze_path(folder)
    assert report["run"]["run_id"] == "iteration_20" and report["run"]["world_size"] == 2
    assert any("read iteration_20, the latest of 2" in note for note in report["skipped"])
    assert diag.analyze_path(folder / "iteration_10")["run"]["world_size"] == 2


@pytest.fixture(scope="module")
def hf_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    out = tmp_path_factory.mktemp("hf")
    run_job(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            str(HERE / "hf_job.py"), str(out), cwd=out)  # fmt: skip
    return out


def test_hf_trainer_is_recorded(hf_out: Path) -> None:
    assert_dp_run_recorded(hf_out / "run", steps=5)
    assert json.loads((hf_out / "run" / "manifest.json").read_text())["trainer"] == "hf"
    for step in records(hf_out / "run", 0, "step"):
        assert step["tokens"] == 4 * 32 and step["loss"] > 0  # the forwards' input_ids


def test_a_callback_given_at_construction_finds_the_ddp_model(hf_out: Path) -> None:
    """`Trainer(..., callbacks=[DiagTrainerCallback(path)])`, no trainer given: dp=2 and the
    gradient all-reduce at the ledger, as with `add_callback(..., trainer)`."""
    report = assert_dp_run_recorded(hf_out / "construction", steps=5)
    assert not any("not recorded" in note for note in report["skipped"]), report["skipped"]


def test_a_slow_forward_pre_hook_is_forward_time(hf_out: Path) -> None:
    """Rank 1's model sleeps 40 ms in a forward pre-hook: its `fwd` spans hold it (it is the
    model's forward call), and no finding calls it host time or data loading."""
    report = diag.analyze_path(hf_out / "construction")
    fwd_s = {rank: sorted((s["t1"] - s["t0"]) / 1e9 for s in records(hf_out / "construction",
                                                                        rank, "span")
                          if s["phase"] == "fwd") for rank in (0, 1)}  # fmt: skip
    assert all(d >= 0.04 for d in fwd_s[1]), fwd_s[1]
    assert fwd_s[1][len(fwd_s[1]) // 2] > fwd_s[0][len(fwd_s[0]) // 2] + 0.03, fwd_s
    assert not [f for f in report["findings"] if f["rule"] == "BAL005"], report["findings"]


def test_an_accelerate_loop_is_recorded(hf_out: Path) -> None:
    assert_dp_run_recorded(hf_out / "accelerate", steps=4)


def test_hf_profiler_traces_are_read_as_written(hf_out: Path, tmp_path: Path) -> None:
    """torch.profiler in a Trainer callback (tensorboard_trace_handler: `host_pid.ts` names, the
    rank in distributedInfo); and the same traces as Megatron-LM's `--use-pytorch-profiler`
    writes them (megatron/training/training.py: `TB/../torch_profile/rank-{R}.json.gz`)."""
    report = diag.analyze_path(hf_out / "traces")
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert {c["group"] for c in report["collectives"]} == {"world"}
    assert all(float(c["count"]).is_integer() for c in report["collectives"])
    megatron = tmp_path / "torch_profile"
    megatron.mkdir()
    for trace in (hf_out / "traces").glob("*.pt.trace.json"):
        rank = json.loads(trace.read_text())["distributedInfo"]["rank"]
        with gzip.open(megatron / f"rank-{rank}.json.gz", "wb") as out:
            out.write(trace.read_bytes())
    assert [r["rank"] for r in diag.analyze_path(megatron)["ranks"]] == [0, 1]
