"""One verdict per job (issue 41): run the same faulty jobs N times beside a CPU hog and count how
often the main finding (rule and ranks) agrees with the most common one, and whether it is the
injected fault.

    python benchmarks/verdict_stability.py [--runs 10] [--jobs straggler,loader-stall,slow-stage]
                                           [--no-hog] [--hogs 1] [--keep DIR]
    python benchmarks/verdict_stability.py --jobs failures --runs 6 --hogs 2

Each job is a real `diag run` (gloo, CPU) of 4 ranks; the hog is one shell spinning a core for
the whole benchmark (on a 2-core machine: 4 ranks and the hog on 2 cores). Prints one row per
job: the most common main finding, how many runs agree with it, how many runs lead with the
injected fault (its rule on its ranks) and how many report it at all, the median cost of the
host's waiting for a core (HST001) beside the fault's, the others seen, the load average at
the job's start. The `healthy` job (no injection, not run by default) counts the runs with no
balance or pipeline finding that names a rank.

The failure jobs (`--jobs failures`: hang, crash, desync, kill; not run by default) end the
job on rank 2 at step 3 of 6 (a short process-group timeout, DIAG_PG_TIMEOUT_S): their main
finding must be the failure's rule on rank 2 (FLR001 hang, FLR002 crash, FLR003 desync, FLR004
lost), analysed at once as the job ends, whatever the load (`--hogs N` spinning shells).
`--jobs readme-failures` runs the same four in the README's own loop on 3 forked ranks, as
tests/distributed/readme_runs.py does (gloo aborts the desynchronised rank before its odd
collective reaches its records: FLR003 or FLR004 on rank 2 is its fault).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag.api import analyze_path


@dataclass(frozen=True)
class Job:
    trainer: str
    args: tuple[str, ...]
    inject: str | None
    rules: tuple[str, ...]  # the rules that name the injected fault (none: a healthy job)
    ranks: tuple[int, ...]  # the ranks it is on
    env: tuple[tuple[str, str], ...] = ()  # the job's environment beyond ours


DP = ("--nproc", "4", "--steps", "8")
FAIL = ("--nproc", "4", "--steps", "6")
FAIL_ENV = (("DIAG_PG_TIMEOUT_S", "10"), ("DIAG_STALL_FLOOR_S", "2"), ("DIAG_HEARTBEAT_S", "0.5"))
"""A failed job ends in seconds (its process groups' timeout); a stall is written within it."""
README = "readme"
README_ARGS = ("--steps", "5", "--pg-timeout-s", "10", "--fail-rank", "2", "--fail-step", "3")
README_ENV = (("DIAG_STALL_FLOOR_S", "1.5"), ("DIAG_HEARTBEAT_S", "0.5"))
ROOT = Path(__file__).resolve().parents[1]
FORKRUN = ROOT / "tests" / "distributed" / "forkrun.py"
JOBS = {
    "straggler": Job("dp", DP, "straggler:rank=3,ms=60", ("BAL001",), (3,)),
    "loader-stall": Job("dp", DP, "loader-stall:rank=2,ms=60", ("BAL005",), (2,)),
    # 4 stages, one rank each: stage 2 is rank 2
    "slow-stage": Job("pp", (*DP, "--microbatches", "4"), "stage-slow:stage=2,ms=20",
                      ("PIP003",), (2,)),
    "healthy": Job("dp", DP, None, (), ()),
    "hang": Job("dp", FAIL, "hang:rank=2,step=3", ("FLR001",), (2,), FAIL_ENV),
    "crash": Job("dp", FAIL, "crash:rank=2,step=3", ("FLR002",), (2,), FAIL_ENV),
    "desync": Job("dp", FAIL, "desync:rank=2,step=3", ("FLR003",), (2,), FAIL_ENV),
    "kill": Job("dp", FAIL, "kill:rank=2,step=3", ("FLR004",), (2,), FAIL_ENV),
    # the README's own loop on 3 forked ranks, as tests/distributed/readme_runs.py runs it
    "readme-hang": Job(README, README_ARGS, "hang", ("FLR001",), (2,), README_ENV),
    "readme-crash": Job(README, README_ARGS, "crash", ("FLR002",), (2,), README_ENV),
    # gloo aborts rank 2 at its odd all-reduce before its records of it reach the disk: the
    # records show a rank that died silently (FLR004), the desync only where they keep it
    "readme-desync": Job(README, README_ARGS, "desync", ("FLR003", "FLR004"), (2,), README_ENV),
    "readme-kill": Job(README, README_ARGS, "kill", ("FLR004",), (2,), README_ENV),
}  # fmt: skip
DEFAULT_JOBS = "straggler,loader-stall,slow-stage"
JOB_SETS = {"failures": "hang,crash,desync,kill",
            "readme-failures": "readme-hang,readme-crash,readme-desync,readme-kill"}  # fmt: skip
HOG = ["sh", "-c", "while :; do :; done"]
HOST_RULE = "HST001"
NAMING_FAMILIES = ("BAL", "PIP")  # a healthy run has none of these naming a rank


@dataclass(frozen=True)
class Outcome:
    main: str  # `RULE ranks` of the main finding ("none" without findings)
    main_is_fault: bool
    fault_found: bool
    host_cost_s: float | None
    fault_cost_s: float | None
    step_s: float | None  # the measured step the costs are of
    healthy: bool = False  # a job without a fault: `fault_found` is a rank named
    named: str = ""  # in a healthy job, the balance and pipeline findings that name a rank

    def line(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1e3:.0f} ms"

        if self.healthy:
            named = f"{self.named} name a rank" if self.fault_found else "no rank named"
            return (
                f"{self.main}: {named}; HST001 {ms(self.host_cost_s)} of a {ms(self.step_s)} step"
            )
        return (f"{self.main}: fault {'main' if self.main_is_fault else 'not main'}, "
                f"{'reported' if self.fault_found else 'not reported'}; HST001 "
                f"{ms(self.host_cost_s)}, fault {ms(self.fault_cost_s)} of a "
                f"{ms(self.step_s)} step")  # fmt: skip


def _is_fault(finding: dict[str, Any], job: Job) -> bool:
    return finding["rule"] in job.rules and tuple(finding["ranks"]) == job.ranks


def _names_a_rank(finding: dict[str, Any]) -> bool:
    return finding["rule"].startswith(NAMING_FAMILIES) and bool(finding["ranks"])


def outcome(job: Job, out: Path) -> Outcome:
    """One fresh run of `job` into `out`, analysed."""
    inject = ["--inject", job.inject] if job.inject else []
    command = [sys.executable, "-m", "diag", "run", job.trainer, *job.args, *inject,
               "--out", str(out)]  # fmt: skip
    cwd = None
    if job.trainer == README:  # forked from one launcher; the run is runs/my-job in its cwd
        command = [sys.executable, str(FORKRUN), "3", "tests.distributed.readme_job",
                   *job.args, "--fail", str(job.inject)]  # fmt: skip
        out.mkdir(parents=True)
        cwd, out = out, out / "runs" / "my-job"
    failing = any(rule.startswith("FLR") for rule in job.rules)  # a failed job exits non-zero
    env = {**os.environ, **dict(job.env), "PYTHONPATH": str(ROOT)}
    subprocess.run(command, check=not failing, capture_output=True, timeout=600, env=env,
                   cwd=cwd)  # fmt: skip
    report = analyze_path(out)
    findings = report["findings"]
    step = (report.get("attribution") or {}).get("measured_step_s")
    host = next((f.get("cost_s") for f in findings if f["rule"] == HOST_RULE), None)
    naming = [f"{f['rule']} {f['ranks']}" for f in findings if _names_a_rank(f)]
    if job.rules:
        faults = [f for f in findings if _is_fault(f, job)]
        found, fault_cost = bool(faults), faults[0].get("cost_s") if faults else None
        is_fault = bool(findings) and _is_fault(findings[0], job)
    else:  # healthy: the "fault" is a balance or pipeline finding naming a rank
        found = bool(naming)
        fault_cost, is_fault = None, not found
    main = f"{findings[0]['rule']} {findings[0]['ranks']}" if findings else "none"
    return Outcome(main, is_fault, found, host, fault_cost, step, not job.rules, ", ".join(naming))


def _median_ms(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known) * 1e3:.0f}" if known else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--jobs", default=DEFAULT_JOBS, help=f"of {', '.join(JOBS)}")
    parser.add_argument("--no-hog", action="store_true", help="run without the CPU hog")
    parser.add_argument("--hogs", type=int, default=1, help="spinning shells beside the jobs")
    parser.add_argument("--keep", type=Path, help="keep the run directories in this folder")
    options = parser.parse_args()
    hogs = [] if options.no_hog else [subprocess.Popen(HOG) for _ in range(options.hogs)]
    try:
        rows = []
        with tempfile.TemporaryDirectory() as scratch:
            tmp = options.keep or Path(scratch)
            tmp.mkdir(parents=True, exist_ok=True)
            for name in JOB_SETS.get(options.jobs, options.jobs).split(","):
                job = JOBS[name]
                load = os.getloadavg()[0]
                started = time.perf_counter()
                runs = []
                for i in range(options.runs):
                    runs.append(outcome(job, tmp / f"{name}-{i}"))
                    print(
                        f"  {name} {i}: {runs[-1].line()} (load1 {os.getloadavg()[0]:.1f})",
                        file=sys.stderr,
                    )
                seen = collections.Counter(r.main for r in runs)
                verdict, agree = seen.most_common(1)[0]
                rows.append((name, job, verdict, agree, runs, seen, load,
                             time.perf_counter() - started))  # fmt: skip
                print(f"{name}: {verdict} in {agree}/{options.runs}", file=sys.stderr)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print("| job | injection | main finding | agree | main is the fault | fault reported | "
          "HST001 ms | fault ms | other verdicts | load1 | s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, job, verdict, agree, runs, seen, load, seconds in rows:
        n = len(runs)
        others = ", ".join(f"{k} x{v}" for k, v in seen.items() if k != verdict)
        expected = (f"{'/'.join(job.rules)} {list(job.ranks)}" if job.rules
                    else "no BAL/PIP naming a rank")  # fmt: skip
        is_fault = sum(r.main_is_fault for r in runs)
        found = sum(r.fault_found for r in runs) if job.rules else "-"
        print(f"| {name} | `{job.inject or '-'}` | {verdict} | {agree}/{n} | "
              f"{is_fault}/{n} ({expected}) | {found}{f'/{n}' if job.rules else ''} | "
              f"{_median_ms([r.host_cost_s for r in runs])} | "
              f"{_median_ms([r.fault_cost_s for r in runs])} | {others or '-'} | "
              f"{load:.1f} | {seconds:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
