"""The host as a cause on real 2-rank DP runs (issue 28's "done when"): a quiet host, a CPU
hog beside the run, a straggler beside a hog, and a hog started midway; prints each run's
findings (rule, severity, cost) and the host finding's evidence.

    python benchmarks/host_contention.py [--steps 24] [--straggler-ms 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from diag.api import analyze_path

HOG = ["sh", "-c", "while :; do :; done"]


def run(out: Path, steps: int, inject: list[str], hog_after_s: float | None) -> None:
    cmd = [sys.executable, "-m", "diag", "run", "dp", "--nproc=2", f"--steps={steps}",
           "--out", str(out), *inject]  # fmt: skip
    hog: list[subprocess.Popen] = []
    timer = None
    if hog_after_s == 0:
        hog.append(subprocess.Popen(HOG))
    elif hog_after_s is not None:
        timer = threading.Timer(hog_after_s, lambda: hog.append(subprocess.Popen(HOG)))
        timer.start()
    try:
        subprocess.run(cmd, check=True, capture_output=True)
    finally:
        if timer is not None:
            timer.cancel()
        for process in hog:
            process.kill()


def _shares(out: Path) -> str:
    from diag.metrics.host import host_steps
    from diag.read.load import load_run

    steps = host_steps(load_run(out).steps).groupby("step")[["descheduled_s", "wall_s"]].sum()
    return " ".join(f"{v:.0%}" for v in steps["descheduled_s"] / steps["wall_s"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--straggler-ms", type=int, default=60)
    parser.add_argument("--midway-s", type=float, default=6.0, help="hog start, seconds in")
    args = parser.parse_args()
    straggler = ["--inject", f"straggler:rank=1,ms={args.straggler_ms}"]
    cases = {
        "quiet": ([], None),
        "hog": ([], 0.0),
        "straggler+hog": (straggler, 0.0),
        "hog midway": ([], args.midway_s),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (inject, hog_after) in cases.items():
            out = Path(tmp) / name.replace(" ", "-").replace("+", "-")
            run(out, args.steps, inject, hog_after)
            findings = analyze_path(out)["findings"]
            listed = ", ".join(
                f"{f['rule']} {f['severity']}"
                + (f" {f['cost_share']:.0%}" if f.get("cost_share") is not None else "")
                + (f" ranks {f['ranks']}" if f["ranks"] else "")
                for f in findings
            )
            print(f"{name:14s} {listed or 'no finding'}")
            for f in findings:
                if f["rule"] in ("HST001", "TRD001"):
                    print(f"{'':14s}   {f['rule']}: {f['title']}")
            print(f"{'':14s}   waiting for a core by step: {_shares(out)}")


if __name__ == "__main__":
    main()
