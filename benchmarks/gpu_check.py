"""Every CUDA path of the collectors and the analysis, checked in one short call on a GPU machine.

    python3 benchmarks/gpu_check.py OUT             # a machine with one GPU: under 8 minutes
    python3 benchmarks/gpu_check.py OUT --dry-run   # here, on CPU: the same steps, CUDA's skipped

Writes OUT/summary.txt (one line per step: PASS, FAIL, SKIP or INFO, its seconds and what it
showed), OUT/summary.json (every figure), and the evidence: OUT/env.json, the jobs' run
directories and profiler traces (OUT/runs/), their logs (OUT/logs/) and diag's reports of each
run directory and trace folder (OUT/reports/). docs/collectors.md ("Checking the CUDA paths on
a GPU") says how to run it on the device machine and what each line means.

The steps: the environment; whether NCCL lets two ranks share the one GPU (it refuses: the
shared-GPU jobs then run on gloo with CUDA tensors, $DIAG_BACKEND=gloo); the allocator's
figures, CUDA-event timing and pynvml in this process against torch's own; the DP trainer and
examples/own_loop.py on NCCL with one rank and on gloo with two ranks sharing the GPU, with
the collectors on and the DP trainer profiled (torch.profiler with CUDA activities); for each
job the collectors' CUDA fields against wall time and the allocator; `diag analyze` of each run
directory and trace folder with HTA's figures beside diag's; an injected straggler and an
injected memory leak on the GPU, diagnosed from both sources. Every step is guarded: one that
fails is recorded with its error and the others go on. With --dry-run the jobs run on CPU
(gloo) and the steps that need CUDA are skipped with their reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_check_env import allocator_and_events, environment  # noqa: E402
from benchmarks.gpu_check_jobs import (  # noqa: E402
    analyze,
    beside_hta,
    collectors_of,
    diagnosed,
    jobs,
    nccl_two_ranks_one_gpu,
    run_job,
)


@dataclass
class Outcome:
    name: str
    status: str  # PASS, FAIL, SKIP, INFO
    seconds: float
    line: str  # what it showed, one line
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Check:
    out: Path
    dry_run: bool
    cuda: bool
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    runs: dict[str, Path] = field(default_factory=dict)  # job -> its run directory

    def step(self, name: str, needs_cuda: bool, fn: Callable[[], tuple[str, str, dict]]) -> None:
        """Run one step, guarded: (status, line, figures), or FAIL with the error."""
        t0 = time.monotonic()
        if needs_cuda and not self.cuda:
            why = "dry run" if self.dry_run else "no CUDA device"
            self._add(Outcome(name, "SKIP", 0.0, f"needs CUDA ({why})"))
            return
        if t0 - self.started > self.budget_s:
            self._add(Outcome(name, "SKIP", 0.0, f"the {self.budget_s:.0f} s budget is spent"))
            return
        try:
            status, line, figures = fn()
        except Exception as err:  # every step guarded: record it and go on
            (self.out / "logs").mkdir(parents=True, exist_ok=True)
            (self.out / "logs" / f"{name}.error.txt").write_text(traceback.format_exc())
            status, line, figures = "FAIL", f"{type(err).__name__}: {err}"[:300], {}
        self._add(Outcome(name, status, time.monotonic() - t0, " ".join(line.split()), figures))

    def _add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        print(_summary_line(outcome), flush=True)


def _summary_line(o: Outcome) -> str:
    return f"{o.status:<4}  {o.name:<28} {o.seconds:6.1f} s  {o.line}"


__all__ = ["Check", "Outcome", "beside_hta", "main", "run_check"]


# --- the whole check ------------------------------------------------------------------------------


def run_check(out: Path, dry_run: bool, budget_s: float, only: set[str] | None) -> list[Outcome]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, dry_run, torch.cuda.is_available() and not dry_run, budget_s)

    def wanted(name: str) -> bool:
        return only is None or any(name.startswith(o) for o in only)

    steps: list[tuple[str, bool, Callable[[], tuple[str, str, dict]]]] = [
        ("environment", False, lambda: environment(check)),
        ("nccl_two_ranks_one_gpu", True, lambda: nccl_two_ranks_one_gpu(check)),
        ("allocator_events_nvml", True, lambda: allocator_and_events(check)),
    ]
    for job in jobs(check):
        steps.append((job.name, False, _bind(run_job, check, job)))  # on CPU in a dry run
        steps.append((f"{job.name}:collectors", True, _bind(collectors_of, check, job.name)))
        steps.append((f"{job.name}:analyze", False, _bind(analyze, check, job.name)))
    steps += [
        ("straggler_diagnosed", False,
         lambda: diagnosed(check, "dp_straggler_2", "BAL001", "rank 1 sleeps 40 ms")),
        ("leak_diagnosed", False,
         lambda: diagnosed(check, "dp_leak_1", "TRD002", "a leak retained every step")),
    ]  # fmt: skip
    for name, needs_cuda, fn in steps:
        if wanted(name):
            check.step(name, needs_cuda, fn)
    _write_summary(check)
    return check.outcomes


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _write_summary(check: Check) -> None:
    counts = {
        s: sum(o.status == s for o in check.outcomes) for s in ("PASS", "FAIL", "SKIP", "INFO")
    }
    head = (f"gpu_check {'(dry run) ' if check.dry_run else ''}"
            f"{time.monotonic() - check.started:.0f} s: "
            + ", ".join(f"{n} {s}" for s, n in counts.items()))  # fmt: skip
    text = "\n".join([head, *(_summary_line(o) for o in check.outcomes)]) + "\n"
    (check.out / "summary.txt").write_text(text)
    (check.out / "summary.json").write_text(json.dumps(
        {"dry_run": check.dry_run, "cuda": check.cuda, "counts": counts,
         "steps": [asdict(o) for o in check.outcomes]}, indent=1, default=str))  # fmt: skip
    print(head, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the summary and the evidence")
    dry = "on CPU: the jobs on gloo, every step that needs CUDA skipped"
    parser.add_argument("--dry-run", action="store_true", help=dry)
    budget = "steps that would start after this many seconds are skipped (default 420)"
    parser.add_argument("--budget-s", type=float, default=420.0, help=budget)
    only = "comma-separated step names (or their prefixes) to run"
    parser.add_argument("--only", default=None, help=only)
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    outcomes = run_check(args.out, args.dry_run, args.budget_s, only)
    return 1 if any(o.status == "FAIL" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
