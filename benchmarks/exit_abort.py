"""How often a finished job aborts at exit: a recorded 2-rank job launched N times under
torchrun, optionally beside a CPU hog; counts non-zero exits and `terminate called` lines
(collectors/pending.py explains the race this guards against).

    python benchmarks/exit_abort.py [--job readme|hf|dp-wrappers|own-loop] [--runs 20] [--hog]

Jobs: `readme` the README's DDP block (tests/distributed/readme_job.py, a slow rank, then a
broken step); `hf` two Hugging Face Trainers and an accelerate loop with DiagTrainerCallback
(tests/distributed/hf_job.py); `dp-wrappers` DDP with bf16 and PowerSGD hooks, then FSDP2
(tests/distributed/dp_wrappers_job.py); `own-loop` examples/own_loop.py (DDP, the recording
hook, traced collectives, `rec.iterate`), as tests/distributed/test_own_loop.py runs it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

JOBS = Path(__file__).resolve().parents[1] / "tests" / "distributed"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def job_arguments(job: str, out: Path) -> list[str]:
    """The script and its arguments for one launch of `job`, writing under `out`."""
    if job == "readme":
        return [str(JOBS / "readme_job.py"), "--slow-rank", "1", "--slow-ms", "40",
                "--then-broken"]  # fmt: skip
    if job == "hf":
        return [str(JOBS / "hf_job.py"), str(out)]
    if job == "own-loop":
        return [str(EXAMPLES / "own_loop.py"), "--out", str(out), "--steps", "5"]
    return [str(JOBS / "dp_wrappers_job.py"), str(out)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--job", choices=["readme", "hf", "dp-wrappers", "own-loop"], default="readme"
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hog", action="store_true", help="a busy loop beside the job")
    args = parser.parse_args()
    hog = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if args.hog else None
    failed = 0
    try:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as cwd:
                launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", *job_arguments(args.job, Path(cwd))]  # fmt: skip
                done = subprocess.run(launch, cwd=cwd, capture_output=True, text=True, timeout=300)
            aborted = "terminate called" in done.stderr
            if done.returncode != 0 or aborted:
                failed += 1
                print(f"run {i}: exit {done.returncode}{', terminate called' if aborted else ''}")
                lines = done.stderr.splitlines()
                at = next((k for k, line in enumerate(lines) if "terminate called" in line), None)
                shown = lines[max(at - 15, 0) : at + 5] if at is not None else lines[-25:]
                print("\n".join(shown))
    finally:
        if hog is not None:
            hog.kill()
    beside = " beside a CPU hog" if args.hog else ""
    print(f"{args.job}: exit aborts {failed} of {args.runs} runs{beside}")


if __name__ == "__main__":
    main()
