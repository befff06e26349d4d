"""benchmarks/gpu_check.py's dry run, here on CPU: the steps that need CUDA are skipped with
their reason, the rest run end to end (a two-rank job with an injected straggler under
torchrun, its analysis from the run directory and the traces, the diagnosis), and the summary
and its evidence are written. Kept short: one job of the six."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = "environment,nccl_two_ranks_one_gpu,allocator,dp_straggler_2,straggler_diagnosed"


@pytest.mark.timeout(600)
def test_the_dry_run_skips_cuda_and_runs_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "check"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), str(out), "--dry-run",
         "--only", STEPS],
        env=env, capture_output=True, text=True, timeout=580, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: s for s in summary["steps"]}
    assert summary["dry_run"] and not summary["cuda"]
    for name in ("nccl_two_ranks_one_gpu", "allocator_events_nvml", "dp_straggler_2:collectors"):
        assert status[name]["status"] == "SKIP" and "needs CUDA (dry run)" in status[name]["line"]
    assert status["environment"]["status"] in ("PASS", "INFO")
    assert status["dp_straggler_2"]["status"] == "PASS", status["dp_straggler_2"]
    # the straggler named from both sources, and the evidence on disk
    found = status["straggler_diagnosed"]
    assert found["status"] == "PASS", found
    assert found["figures"]["run"]["ranks"] == [1] and found["figures"]["traces"]["ranks"] == [1]
    for evidence in ("summary.txt", "env.json", "reports/dp_straggler_2-run.json",
                     "reports/dp_straggler_2-traces.json", "logs/dp_straggler_2.log",
                     "runs/dp_straggler_2/manifest.json"):  # fmt: skip
        assert (out / evidence).is_file(), evidence
    lines = (out / "summary.txt").read_text().splitlines()
    assert lines[0].startswith("gpu_check (dry run)") and len(lines) == 1 + len(status)


REAL_NCCL = ROOT.parent / "shared" / "real-traces" / "hta-nccl-world2"


@pytest.mark.skipif(not REAL_NCCL.is_dir(), reason="../shared/real-traces is absent")
def test_htas_figures_beside_diags_on_a_real_gpu_trace() -> None:
    """What the check's analysis step reports on a GPU job's traces, here on a real one: diag's
    temporal breakdown and idle split within a point of HTA's."""
    pytest.importorskip("hta")
    import importlib.util

    from diag.api import analyze_path

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up there
    spec.loader.exec_module(gpu_check)
    beside = gpu_check.beside_hta(analyze_path(REAL_NCCL, hta=True))
    assert beside["worst_points"] <= 1.0 and beside["idle_split"]["worst_points"] <= 1.0, beside
    assert beside["idle_split"]["hta"][0] > 99  # host wait, as HTA splits it
