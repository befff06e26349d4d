"""Ground truth at 256 ranks (dp4 x tp8 x pp8, m = 32): a straggler, a slow stage and jitter,
injected into `diag simulate`, written in each foreign shape (our records, Megatron's names,
the dp group's collectives unrecorded, a GPU job's profiler traces), must be the main finding,
naming the right ranks, at a cost within 20% of what removing the cause saves: for the
straggler and the slow stage, what the injection adds to the step (the faulty run's measured
step against the healthy one's, in the same shape); for jitter (random per-step imbalance,
BAL004, no rank), what balancing the draws saves (the faulty run against the same run with
each step's draws replaced by their mean over each stage's ranks, in the same shape), with
the finding's noise bound shown against what the jitter adds. A script, not a suite test:
each shape costs about a minute and a half on two cores.

    .venv/bin/python benchmarks/foreign_shapes_3d.py [--out DIR]

Prints one line per (shape, fault) and exits 1 when one misses.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from diag.api import analyze_path
from diag.contract.schema import Layout
from simulator.cli import simulate as simulate_command
from simulator.injections import Faults

LAYOUT = ["--ranks", "256", "--layout", "dp=4,tp=8,pp=8", "--microbatches", "32", "--steps", "4"]
READ_WITH = Layout(dp=4, tp=8, pp=8, microbatches=32)
SHAPES = {"ours": [], "megatron": ["--tags", "megatron"], "untraced-dp": ["--untraced", "dp"],
          "kineto": ["--format", "kineto"]}  # fmt: skip
FAULTS = {  # injection -> the ranks the main finding must name
    "straggler:rank=77,ms=10": [77],
    "stage-slow:stage=5,ms=3": sorted(r for r in range(256) if (r // 8) % 8 == 5),
    "jitter:ms=100": [],
}
JITTER = "jitter:ms=100"
STAGE_OF_RANK = (np.arange(256) // 8) % 8
"""The grid order of the layout: rank = (dp_i * pp + pp_i) * tp + tp_i."""
RECOVERED_WITHIN = 0.20


def simulate(out: Path, *args: str) -> Path:
    command = [sys.executable, "-m", "diag", "simulate", "--out", str(out), *LAYOUT, *args]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return out


def simulate_balanced_jitter(out: Path, *args: str) -> Path:
    """The jitter run with each step's draws replaced by their mean over each stage's ranks (in
    this process: the simulator's own draws, averaged)."""
    drawn = Faults.jitter_ns

    def balanced(faults: Faults, step: int) -> np.ndarray | None:
        draws = drawn(faults, step)
        if draws is None:
            return None
        return pd.Series(draws).groupby(STAGE_OF_RANK).transform("mean").to_numpy()

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(Faults, "jitter_ns", balanced)
        simulate_command.main([*LAYOUT, "--inject", JITTER, *args, "--out", str(out)],
                              standalone_mode=False)  # fmt: skip
    return out


def report_of(path: Path, shape: str) -> dict[str, Any]:
    return analyze_path(path, layout=READ_WITH if shape == "kineto" else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="Keep the runs here.")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="shapes3d-"))
    missed = 0
    try:
        for shape, flags in SHAPES.items():
            healthy = report_of(simulate(root / f"{shape}-healthy", *flags), shape)
            healthy_s = healthy["attribution"]["measured_step_s"]
            for fault, ranks in FAULTS.items():
                started = time.perf_counter()
                path = simulate(root / f"{shape}-{fault.split(':')[0]}", "--inject", fault, *flags)
                report = report_of(path, shape)
                main_finding = report["findings"][0]
                measured_s = report["attribution"]["measured_step_s"]
                injected_s = measured_s - healthy_s
                note = ""
                if fault == JITTER:
                    bound_s = main_finding.get("evidence", {}).get("if_noise_saves_s", 0.0)
                    note = f"; noise bound {bound_s * 1e3:.1f} ms of {injected_s * 1e3:.1f} added"
                    balanced = simulate_balanced_jitter(root / f"{shape}-balanced", *flags)
                    injected_s = measured_s - report_of(balanced, shape)["attribution"][
                        "measured_step_s"]  # fmt: skip
                cost_s = main_finding.get("cost_s") or 0.0
                error = (cost_s - injected_s) / injected_s if injected_s > 0 else float("inf")
                ok = main_finding["ranks"] == ranks and abs(error) <= RECOVERED_WITHIN
                missed += not ok
                print(f"{shape:12s} {fault:26s} {main_finding['rule']} "
                      f"{'ranks ok' if main_finding['ranks'] == ranks else 'WRONG RANKS'}  "
                      f"cost {cost_s * 1e3:7.1f} ms, injected {injected_s * 1e3:7.1f} ms "
                      f"({error:+.0%}){note}  {'ok' if ok else 'MISSED'}  "
                      f"[{time.perf_counter() - started:.0f} s]", flush=True)  # fmt: skip
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
