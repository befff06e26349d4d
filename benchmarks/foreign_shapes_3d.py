"""Ground truth at 256 ranks (dp4 x tp8 x pp8, m = 32): a straggler and a slow stage, injected
into `diag simulate`, written in each foreign shape (our records, Megatron's names, the dp
group's collectives unrecorded, a GPU job's profiler traces), must be the main finding, naming
the right ranks, at a cost within 20% of what the injection adds to the step (the faulty
run's measured step against the healthy one's, in the same shape). A script, not a suite
test: each shape costs about a minute on two cores.

    .venv/bin/python benchmarks/foreign_shapes_3d.py [--out DIR]

Prints one line per (shape, fault) and exits 1 when one misses.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from diag.api import analyze_path
from diag.contract.schema import Layout

LAYOUT = ["--ranks", "256", "--layout", "dp=4,tp=8,pp=8", "--microbatches", "32", "--steps", "4"]
READ_WITH = Layout(dp=4, tp=8, pp=8, microbatches=32)
SHAPES = {"ours": [], "megatron": ["--tags", "megatron"], "untraced-dp": ["--untraced", "dp"],
          "kineto": ["--format", "kineto"]}  # fmt: skip
FAULTS = {  # injection -> the ranks the main finding must name
    "straggler:rank=77,ms=10": [77],
    "stage-slow:stage=5,ms=3": sorted(r for r in range(256) if (r // 8) % 8 == 5),
}
RECOVERED_WITHIN = 0.20


def simulate(out: Path, *args: str) -> Path:
    command = [sys.executable, "-m", "diag", "simulate", "--out", str(out), *LAYOUT, *args]
    subprocess.run(command, check=True, capture_output=True, text=True)
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
                injected_s = report["attribution"]["measured_step_s"] - healthy_s
                cost_s = main_finding.get("cost_s") or 0.0
                error = (cost_s - injected_s) / injected_s if injected_s > 0 else float("inf")
                ok = main_finding["ranks"] == ranks and abs(error) <= RECOVERED_WITHIN
                missed += not ok
                print(f"{shape:12s} {fault:26s} {main_finding['rule']} "
                      f"{'ranks ok' if main_finding['ranks'] == ranks else 'WRONG RANKS'}  "
                      f"cost {cost_s * 1e3:7.1f} ms, injected {injected_s * 1e3:7.1f} ms "
                      f"({error:+.0%})  {'ok' if ok else 'MISSED'}  "
                      f"[{time.perf_counter() - started:.0f} s]", flush=True)  # fmt: skip
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
