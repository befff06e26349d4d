"""Random imbalance read from one rank per tensor-parallel group (issue 39): a simulated
dp2 x tp2 x pp4 jitter job (`jitter:ms=60`, 4 steps) per seed and schedule, analysed as its
run directory and as its trace folder with one rank per TP group traced; BAL004's cost from
each, side by side, and how many are within 20% (docs/metrics.md, "an untraced member read
from its lockstep partner").

    .venv/bin/python benchmarks/jitter_one_per_tp.py [--seeds 0-9] [--steps 4]

The untraced members' own work is estimated (diag/whatif/absent_members.py), so the cost
varies with the steps the estimate has; the run directory's split of the imbalance into
persistent and random parts varies with them too.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diag.api import analyze_path  # noqa: E402

WITHIN = 0.20
JOB = ["--ranks", "16", "--layout", "dp=2,tp=2,pp=4", "--layers", "8", "--microbatches", "16",
       "--inject", "jitter:ms=60"]  # fmt: skip


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def _simulate(out: Path, args: list[str]) -> Path:
    command = [sys.executable, "-m", "diag", "simulate", "--out", str(out), *args]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    return out


def _imbalance(report: dict[str, Any]) -> tuple[str | None, float | None]:
    """The main finding's rule and BAL004's cost (s; None where it has none)."""
    main = report["findings"][0]["rule"] if report["findings"] else None
    found = [f for f in report["findings"] if f["rule"] == "BAL004"]
    return main, (found[0]["cost_s"] if found else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-9", help="a seed or a range, e.g. 0-9")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    errors: list[float] = []
    print("| schedule | seed | run dir: main, BAL004 ms | one per TP: main, BAL004 ms | error |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for schedule, virtual in (("1f1b", "1"), ("interleaved", "2")):
            for seed in _seeds(args.seeds):
                job = [*JOB, "--steps", str(args.steps), "--schedule", schedule,
                       "--virtual-stages", virtual, "--seed", str(seed)]  # fmt: skip
                name = f"{schedule}-{seed}"
                run = _simulate(root / f"run-{name}", [*job, "--format", "arrow"])
                traces = _simulate(
                    root / f"traces-{name}",
                    [*job, "--format", "kineto", "--traced-ranks", "one-per-tp"],
                )
                (want_rule, want), (got_rule, got) = (
                    _imbalance(analyze_path(run)),
                    _imbalance(analyze_path(traces)),
                )
                error = None if not want or got is None else got / want - 1
                if error is not None:
                    errors.append(error)
                shown = "-" if error is None else f"{error:+.1%}"
                print(f"| {schedule} | {seed} | {want_rule}, {_ms(want)} | {got_rule}, "
                      f"{_ms(got)} | {shown} |", flush=True)  # fmt: skip
    if errors:
        inside = sum(abs(e) <= WITHIN for e in errors)
        mean = sum(abs(e) for e in errors) / len(errors)
        print(f"\n{inside} of {len(errors)} within {WITHIN:.0%}; from {min(errors):+.0%} to "
              f"{max(errors):+.0%}, mean |error| {mean:.0%}")  # fmt: skip
    return 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


if __name__ == "__main__":
    sys.exit(main())
