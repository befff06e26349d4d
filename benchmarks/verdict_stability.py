"""One verdict per job (issue 41): run the same faulty jobs N times beside a CPU hog and count how
often the main finding (rule and ranks) agrees with the most common one.

    python benchmarks/verdict_stability.py [--runs 10] [--jobs straggler,loader-stall,slow-stage]

Each job is a real `diag run` (gloo, CPU) of 4 ranks; the hog is one process spinning a core
for the whole benchmark (on a 2-core machine: 4 ranks and the hog on 2 cores). Prints one row
per job: the most common main finding, how many runs agree with it, and the others seen.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diag.api import analyze_path

JOBS = {
    # name: (trainer, its arguments, the injection)
    "straggler": ("dp", ["--nproc", "4", "--steps", "8"], "straggler:rank=3,ms=60"),
    "loader-stall": ("dp", ["--nproc", "4", "--steps", "8"], "loader-stall:rank=2,ms=60"),
    "slow-stage": ("pp", ["--nproc", "4", "--steps", "8", "--microbatches", "4"],
                   "stage-slow:stage=2,ms=20"),
}  # fmt: skip
HOG = "import time\nwhile True:\n    sum(range(10_000))\n"


def main_finding(trainer: str, args: list[str], inject: str, out: Path) -> str:
    """`RULE ranks` of one fresh run's main finding ("none" without findings)."""
    command = [sys.executable, "-m", "diag", "run", trainer, *args, "--inject", inject,
               "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    findings = analyze_path(out)["findings"]
    if not findings:
        return "none"
    first = findings[0]
    return f"{first['rule']} {first['ranks']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--jobs", default=",".join(JOBS))
    options = parser.parse_args()
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for name in options.jobs.split(","):
                trainer, args, inject = JOBS[name]
                started = time.perf_counter()
                seen = collections.Counter(
                    main_finding(trainer, args, inject, Path(tmp) / f"{name}-{i}")
                    for i in range(options.runs)
                )
                verdict, agree = seen.most_common(1)[0]
                others = ", ".join(f"{k} x{v}" for k, v in seen.items() if k != verdict)
                rows.append((name, inject, verdict, agree, options.runs, others,
                             time.perf_counter() - started))  # fmt: skip
                print(f"{name}: {verdict} in {agree}/{options.runs}", file=sys.stderr)
    finally:
        hog.kill()
        hog.wait()
    print("| job | injection | main finding | agree | other verdicts | s |")
    print("|---|---|---|---|---|---|")
    for name, inject, verdict, agree, runs, others, seconds in rows:
        print(f"| {name} | `{inject}` | {verdict} | {agree}/{runs} | {others or '-'} | "
              f"{seconds:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
