"""How often a finished job aborts at exit: the README's DDP block (tests/distributed/readme_job.py)
launched N times under torchrun, 2 ranks, optionally beside a CPU hog; counts non-zero exits and
`terminate called` lines (collectors/pending.py explains the race this guards against).

    python benchmarks/exit_abort.py [--runs 20] [--hog]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "tests" / "distributed" / "readme_job.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hog", action="store_true", help="a busy loop beside the job")
    args = parser.parse_args()
    hog = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if args.hog else None
    failed = 0
    try:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as cwd:
                launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", str(JOB), "--slow-rank", "1", "--slow-ms", "40",
                          "--then-broken"]  # fmt: skip
                done = subprocess.run(launch, cwd=cwd, capture_output=True, text=True, timeout=300)
            aborted = "terminate called" in done.stderr
            if done.returncode != 0 or aborted:
                failed += 1
                print(f"run {i}: exit {done.returncode}{', terminate called' if aborted else ''}")
    finally:
        if hog is not None:
            hog.kill()
    print(f"exit aborts: {failed} of {args.runs} runs{' beside a CPU hog' if args.hog else ''}")


if __name__ == "__main__":
    main()
