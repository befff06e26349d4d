"""Issue 40's "Done when", as a table: real gloo jobs that do not finish, and the first finding
`diag analyze` gives from the run directory alone, from its Flight Recorder dumps alone and from
both; the same jobs without the failure.

    python benchmarks/failure_matrix.py [--jobs readme,dp,tp,pp,ep,zero3]
        [--failures hang,crash,desync,kill,none] [--nproc 4] [--steps 8] [--rank 2] [--step 4]
        [--pg-timeout-s 15] [--stall-floor-s 4] [--workers 1] [--keep DIR]

With `--keep DIR` the runs stay in DIR; a run already there is analysed again, not launched.

`readme` is the README's own loop (tests/distributed/readme_job.py under torchrun, `--fail`);
the others are the reference trainers (`diag run TRAINER --inject FAILURE:rank=R,step=S`).
Each row: the first finding of each source (rule, named ranks, step, collective or exception),
whether it names the injected rank, step and a collective (or the exception: a Flight Recorder
dump holds no steps and no exceptions, so there `-` means the source cannot say), the status,
and `diag check`'s exit. A healthy row must have no FLR finding and the status completed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README_JOB = ROOT / "tests" / "distributed" / "readme_job.py"
FR_DIR = "flight-recorder"


@dataclass(frozen=True)
class Case:
    job: str
    failure: str  # hang | crash | desync | kill | none


def launch(case: Case, out: Path, args: argparse.Namespace) -> tuple[Path, float]:
    """Run the job (it ends by itself: the process groups' timeout ends a failed one); its run
    directory and the wall time in seconds."""
    env = {**os.environ, "DIAG_STALL_FLOOR_S": str(args.stall_floor_s),
           "DIAG_PG_TIMEOUT_S": str(args.pg_timeout_s), "PYTHONPATH": str(ROOT)}  # fmt: skip
    start = time.monotonic()
    if case.job == "readme":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={args.nproc}", str(README_JOB), "--steps", str(args.steps),
                   "--pg-timeout-s", str(args.pg_timeout_s)]  # fmt: skip
        if case.failure != "none":
            # the README loop counts its forwards from 0, the trainers their steps from 0 too
            command += ["--fail", case.failure, "--fail-rank", str(args.rank),
                        "--fail-step", str(args.step)]  # fmt: skip
        out.mkdir(parents=True)
        subprocess.run(command, cwd=out, env=env, capture_output=True, timeout=900)
        return out / "runs" / "my-job", time.monotonic() - start
    command = [sys.executable, "-m", "diag", "run", case.job, "--nproc", str(args.nproc),
               "--out", str(out), "--steps", str(args.steps)]  # fmt: skip
    if case.failure != "none":
        command += ["--inject", f"{case.failure}:rank={args.rank},step={args.step}"]
    subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=900)
    return out, time.monotonic() - start


def analyze(path: Path) -> dict[str, Any] | str:
    """The JSON report of `path`, or the error line."""
    done = subprocess.run([sys.executable, "-m", "diag", "analyze", str(path), "--format", "json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:80]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def check(path: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "diag", "check", str(path)], capture_output=True,
                          timeout=600, cwd=ROOT, env=env)  # fmt: skip
    return done.returncode


def steps_named(finding: dict[str, Any]) -> set[int]:
    """Every step the finding's evidence names (the stuck collective's, the exception's, where
    the missing rank stopped)."""
    found: set[int] = set()

    def walk(value: Any, depth: int) -> None:
        if depth > 6:
            return
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "step" and isinstance(item, int):
                    found.add(item)
                else:
                    walk(item, depth + 1)
        elif isinstance(value, list):
            for item in value:
                walk(item, depth + 1)

    walk(finding.get("evidence"), 0)
    return found


def what_named(finding: dict[str, Any]) -> str:
    """The collective (`op #seq of group`) or the exception type the finding names, or ''."""
    evidence = finding.get("evidence") or {}
    exception = evidence.get("exception")
    if isinstance(exception, dict) and exception.get("type"):
        return str(exception["type"])
    stuck = evidence.get("collective")
    if isinstance(stuck, dict) and stuck.get("op"):
        return f"{stuck['op']} #{stuck.get('seq')} of {stuck.get('group')}"
    if evidence.get("op"):  # a desync
        return f"{evidence['op']} #{evidence.get('seq')} of {evidence.get('group')}"
    if isinstance(evidence.get("collective"), str) and evidence["collective"]:
        return str(evidence["collective"])  # a lost rank: where it stopped
    return ""


def judge(case: Case, report: dict[str, Any] | str, args: argparse.Namespace) -> dict[str, str]:
    if isinstance(report, str):
        return {"first": f"error: {report}", "ok": "-"}
    findings = report.get("findings") or []
    status = str((report.get("summary") or {}).get("status") or "")
    first = findings[0] if findings else {}
    rule = str(first.get("rule", "none"))
    if case.failure == "none":
        flr = [f["rule"] for f in findings if str(f.get("rule", "")).startswith("FLR")]
        ok = "ok" if not flr and status in ("completed", "") else f"BAD {flr} {status}"
        return {"first": f"{rule} status={status}", "ok": ok}
    ranks = first.get("ranks") or []
    steps = steps_named(first)
    what = what_named(first)
    marks = [
        "R" if args.rank in ranks else "r",
        "S" if args.step in steps else ("-" if not steps else "s"),
        "C" if what else "c",
    ]
    title = f"{rule} ranks={ranks} steps={sorted(steps)} {what}"
    return {"first": title, "ok": "".join(marks), "status": status}


def run_case(case: Case, base: Path, args: argparse.Namespace) -> list[str]:
    out = base / f"{case.job}-{case.failure}"
    if out.exists():  # a kept run (--keep DIR again): analysed again, not launched
        run, wall_s = (out / "runs" / "my-job" if case.job == "readme" else out), float("nan")
    else:
        run, wall_s = launch(case, out, args)
    if not run.is_dir():
        return [case.job, case.failure, f"{wall_s:.0f}", "no run directory", "", "", "", ""]
    alone = base / f"{case.job}-{case.failure}-alone"
    if not alone.exists():
        shutil.copytree(run, alone, ignore=shutil.ignore_patterns(FR_DIR))
    rows = [judge(case, analyze(alone), args)]
    dumps = run / FR_DIR
    rows.append(judge(case, analyze(dumps), args) if dumps.is_dir() else
                {"first": "no dumps", "ok": "-"})  # fmt: skip
    rows.append(judge(case, analyze(run), args))
    status = rows[2].get("status", rows[2]["first"].split("status=")[-1])
    return [case.job, case.failure, f"{wall_s:.0f}",
            *(f"{r['ok']:4} {r['first']}" for r in rows), status, str(check(run))]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="readme,dp,tp,pp,ep,zero3")
    parser.add_argument("--failures", default="hang,crash,desync,kill,none")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--step", type=int, default=4)
    parser.add_argument("--pg-timeout-s", type=float, default=15.0)
    parser.add_argument("--stall-floor-s", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    args = parser.parse_args()
    cases = [Case(j, f) for j in args.jobs.split(",") for f in args.failures.split(",")]
    base = args.keep or Path(tempfile.mkdtemp(prefix="failure-matrix-"))
    base.mkdir(parents=True, exist_ok=True)
    header = ["job", "failure", "wall s", "run alone", "dumps alone", "both", "status", "check"]
    print(
        "marks: R/r rank named or not, S/s step named right or wrong (- none named), "
        "C/c collective or exception named or not",
        flush=True,
    )
    print(" | ".join(header), flush=True)
    try:
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            for row in pool.map(lambda c: run_case(c, base, args), cases):
                print(" | ".join(row), flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
