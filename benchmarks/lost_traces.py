"""Trace folders with ranks' files lost (issue 39, "with records missing"): a simulated job's
GPU profiler traces analysed whole and with some ranks' files removed, at random or by rank.
The folder with files lost must give the whole folder's main finding (rule and ranks) and its
cost within 20%; where the named rank itself was lost, the waiting for it (BAL006) on that
rank (and on no rank that left its trace: a lost node's whole TP group, which steps together,
may be named with it).

    .venv/bin/python benchmarks/lost_traces.py [--jobs 16 healthy megatron old 256] [--seeds 3]

Prints one line per folder and exits 1 when one misses. The jobs:
- `16`: a dp2 x tp2 x pp4 straggler (1F1B and interleaved) and slow stage, a dp2 x pp4 and
  a dp4 x tp2 straggler; a fifth of the files removed at random, per seed; and for the
  straggler, a whole TP group's (a node lost: the straggler's, its next stage's, the last's);
- `healthy`: the 3D job and the dp2 x pp4 one without a fault (their last stage the heavier:
  PIP003), and a jitter job; likewise;
- `megatron`: Megatron's trace shape (batched sends and receives naming their peers): the 3D
  straggler and slow stage (1F1B and interleaved) with the straggler's, its next stage's,
  a rank of each of those stages', three ranks of three stages', or a node's files removed;
  a dp2 x pp4 straggler (no TP partner to stand in) with each of five ranks' files removed;
- `old`: the 3D straggler in an older trace's shape (no process groups: the layout read from
  what the ranks do, diag/read/kineto/grid_placement.py), a fifth of the files removed at
  random per seed, and the straggler's, its TP partner's, its next stage's;
- `256`: a dp4 x tp8 x pp8 straggler, a tenth of the files removed at random per seed, and
  the straggler's, its TP partner's, its next stage's two ranks', and a node's (a whole TP
  group of 8: the straggler's, its next stage's, the last stage's); `256-megatron`: the
  same in Megatron's trace shape.
docs/metrics.md ("an untraced member read from its lockstep partner") gives the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COST_WITHIN = 0.20
"""Relative: the folder's main cost against the whole folder's."""
UNTRACED_RULE = "BAL006"
"""The finding where the rank the whole folder names left no trace: the waiting for it."""
STRAGGLER_3D = 10  # dp2 x tp2 x pp4: dp 1, stage 1, first of its TP group
STRAGGLER_256 = 200  # dp4 x tp8 x pp8: dp 3, stage 1, first of its TP group
THREE_D = "--ranks 16 --layout dp=2,tp=2,pp=4 --layers 8 -m 16 --steps 4"
INTERLEAVED = "--schedule interleaved --virtual-stages 2"
NODES_3D = ((10, 11), (12, 13), (14, 15))
LOST_256 = (
    (STRAGGLER_256,),
    (STRAGGLER_256 + 1,),
    (STRAGGLER_256 + 8, STRAGGLER_256 + 9),
    # a node lost: the straggler's TP group of 8, its next stage's, the last stage's
    tuple(range(200, 208)),
    tuple(range(208, 216)),
    tuple(range(248, 256)),
)
"""At 256 ranks: the straggler's file, its TP partner's, its next stage's two, three nodes'."""
MEGATRON_LOST = ((10,), (12,), (11, 12), (4, 9, 13), *NODES_3D)
"""The straggler's file, its next stage's, a rank of each of those stages, three of three
stages', and a node's (a whole TP group: the straggler's, its next stage's, the last's)."""
"""A node lost: a whole TP group's files (the straggler's, its next stage's, the last stage's)."""


@dataclass(frozen=True)
class Job:
    """A simulated job and how its files are lost: `fraction` of them at random per seed, or
    each set of ranks in `lost`."""

    name: str
    args: str
    fraction: float = 0.0
    lost: tuple[tuple[int, ...], ...] = ()


def jobs(which: list[str]) -> list[Job]:
    straggler = f"--inject straggler:rank={STRAGGLER_3D},ms=15"
    found = {
        "16": [
            Job("3d-straggler", f"{THREE_D} {straggler}", 0.2, lost=NODES_3D),
            Job("3d-straggler-interleaved", f"{THREE_D} {INTERLEAVED} {straggler}", 0.2,
                lost=NODES_3D),
            Job("3d-slow-stage", f"{THREE_D} --inject stage-slow:stage=1,ms=10", 0.2),
            Job("dp2pp4-straggler", "--ranks 8 --layout dp=2,pp=4 --layers 8 -m 16 --steps 4 "
                "--inject straggler:rank=5,ms=15", 0.2),
            Job("dp4tp2-straggler", "--ranks 8 --layout dp=4,tp=2 -m 4 --steps 4 "
                "--inject straggler:rank=3,ms=15", 0.2),
        ],
        "healthy": [
            Job("3d-healthy", THREE_D, 0.2),
            Job("3d-healthy-interleaved", f"{THREE_D} {INTERLEAVED}", 0.2),
            Job("dp2pp4-healthy", "--ranks 8 --layout dp=2,pp=4 --layers 8 -m 16 --steps 4", 0.2),
            Job("3d-jitter", f"{THREE_D.replace('--steps 4', '--steps 5')} --inject jitter:ms=60",
                0.2),
        ],
        "megatron": [
            Job("3d-straggler-megatron", f"{THREE_D} {straggler} --trace-shape megatron",
                lost=MEGATRON_LOST),
            Job("3d-straggler-megatron-interleaved",
                f"{THREE_D} {INTERLEAVED} {straggler} --trace-shape megatron", lost=MEGATRON_LOST),
            Job("dp2pp4-straggler-megatron", "--ranks 8 --layout dp=2,pp=4 --layers 8 -m 16 "
                "--steps 4 --inject straggler:rank=5,ms=15 --trace-shape megatron",
                lost=((4,), (5,), (6,), (2,), (0,))),
            Job("3d-slow-stage-megatron",
                f"{THREE_D} --inject stage-slow:stage=1,ms=10 --trace-shape megatron",
                lost=MEGATRON_LOST),
            Job("3d-slow-stage-megatron-interleaved",
                f"{THREE_D} {INTERLEAVED} --inject stage-slow:stage=1,ms=10 "
                "--trace-shape megatron", lost=MEGATRON_LOST),
        ],
        "old": [
            Job("3d-straggler-old", f"{THREE_D} {straggler} --trace-shape old", 0.2,
                lost=((STRAGGLER_3D,), (STRAGGLER_3D + 1,), (STRAGGLER_3D + 2,))),
        ],
        "256": [
            Job("256-straggler", "--ranks 256 --layout dp=4,tp=8,pp=8 --layers 16 -m 16 "
                f"--steps 4 --inject straggler:rank={STRAGGLER_256},ms=15", 0.1,
                lost=LOST_256),
        ],
        "256-megatron": [
            Job("256-straggler-megatron", "--ranks 256 --layout dp=4,tp=8,pp=8 --layers 16 "
                f"-m 16 --steps 4 --inject straggler:rank={STRAGGLER_256},ms=15 "
                "--trace-shape megatron", 0.1, lost=LOST_256),
        ],
    }  # fmt: skip
    return [job for name in which for job in found[name]]


def simulate(job: Job, out: Path) -> Path:
    command = [sys.executable, "-m", "diag", "simulate", *job.args.split(), "--format", "kineto",
               "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1])
    return out


def main_finding(folder: Path, cache: Path) -> dict[str, Any]:
    """The folder's first finding, analysed cold in its own process."""
    command = [sys.executable, "-m", "diag", "analyze", str(folder), "--format", "json"]
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}  # cold: a cache of its own
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200,
                            env=env)  # fmt: skip
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"diag analyze {folder}: {result.stderr.strip()[-2000:]}")
    report = json.loads(result.stdout)
    first = report["findings"][0] if report["findings"] else {}
    return {"rule": first.get("rule"), "ranks": first.get("ranks") or [],
            "cost_s": first.get("cost_s") or 0.0}  # fmt: skip


def rank_of(path: Path) -> int:
    return int(json.loads(path.read_text())["distributedInfo"]["rank"])


def without(whole: Path, lost: set[int], into: Path) -> Path:
    """A copy (links) of the trace folder without the files of the ranks `lost`."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for path in sorted(whole.glob("*.json")):
        if rank_of(path) not in lost:
            (into / path.name).symlink_to(path.resolve())
    return into


def misses(whole: dict[str, Any], part: dict[str, Any], lost: set[int]) -> str:
    """Why the folder with files lost misses the whole folder's verdict ('' where it does not)."""
    named = set(whole["ranks"])
    if named and named <= lost:
        # the waiting for them, on the lost ranks that hold them: a lost node's whole TP group
        # steps together, and which of its members was late its peers' traces cannot say
        got = set(part["ranks"])
        if part["rule"] != UNTRACED_RULE or not named <= got <= lost:
            return f"{part['rule']} {part['ranks']}, not {UNTRACED_RULE} on {sorted(named)}"
    elif (part["rule"], part["ranks"]) != (whole["rule"], whole["ranks"]):
        return f"{part['rule']} {part['ranks']}, not {whole['rule']} {whole['ranks']}"
    if abs(part["cost_s"] - whole["cost_s"]) > COST_WITHIN * max(whole["cost_s"], 1e-9):
        return f"cost {part['cost_s'] * 1e3:.1f} ms, not {whole['cost_s'] * 1e3:.1f} ms"
    return ""


def said(finding: dict[str, Any]) -> str:
    ranks = ",".join(str(r) for r in finding["ranks"][:8]) + ("..." * (len(finding["ranks"]) > 8))
    return f"{finding['rule']} [{ranks}] {finding['cost_s'] * 1e3:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=["16", "healthy", "megatron"],
                        choices=["16", "healthy", "megatron", "old", "256",
                                 "256-megatron"])  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for job in jobs(args.jobs):
            whole_dir = simulate(job, root / job.name)
            whole = main_finding(whole_dir, root / "cache")
            print(f"{job.name}: whole folder {said(whole)}", flush=True)
            files = sorted(whole_dir.glob("*.json"))  # by name, as a listing gives them
            losses = [set(lost) for lost in job.lost]
            if job.fraction:
                count = max(1, int(len(files) * job.fraction))
                losses += [{rank_of(p) for p in random.Random(s).sample(files, count)}
                           for s in range(args.seeds)]  # fmt: skip
            for n, lost in enumerate(losses):
                part_dir = without(whole_dir, lost, root / f"{job.name}-{n}")
                part = main_finding(part_dir, root / f"cache-{job.name}-{n}")
                why = misses(whole, part, lost)
                failed += bool(why)
                shown = ",".join(str(r) for r in sorted(lost))
                print(f"  lost {shown}: {said(part)}  {'right' if not why else 'MISS: ' + why}",
                      flush=True)  # fmt: skip
    print(f"{failed} missed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
