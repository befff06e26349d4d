"""The cost of taking in one new step of a growing run, from step 100 to step 10,000 (issue 31,
item 3): what `diag watch` and `diag dashboard --live` pay each time every rank finishes a step.

    python benchmarks/live_incremental.py                     # 64 ranks, 10,000 steps
    python benchmarks/live_incremental.py --ranks 8 --steps 1000 --at 100,1000   # a quick look
    python benchmarks/live_incremental.py --baseline          # and a whole re-analysis at each

A simulated run (`diag simulate --ranks R --steps S --format jsonl`, written once into
`--work`) is replayed as a job writes it: a run directory whose manifest says `running` grows by
appending each step's lines to every rank file. Up to each step of `--at` it grows in chunks of
`--chunk` steps (taken in untimed); there, `--probes` single steps are appended one at a time and
each is timed: `update` (read the bytes appended, take in the step: its per-step tables) and
`analyse` (`LiveRun.run()` and `diagnose`, the dashboard's whole-run view: every step so far).
Printed per point: the medians, the resident memory, and with `--baseline` what the dashboard
paid before (a whole re-read and re-analysis of the run so far: `load_any` + `diagnose`).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diag import LiveRun, diagnose, load_any  # noqa: E402
from diag.contract import schema  # noqa: E402

STEP_MARK = b'"kind":"step"'


def simulate(out: Path, ranks: int, steps: int) -> None:
    """The source run, written once (kept between runs of the benchmark)."""
    if (out / schema.MANIFEST_FILE).is_file():
        return
    command = [sys.executable, "-m", "diag", "simulate", "--ranks", str(ranks), "--steps",
               str(steps), "--format", "jsonl", "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def step_ends(path: Path) -> list[int]:
    """Per step, the offset in a rank file just after its step record (the last line a rank
    writes for a step)."""
    ends, at = [], 0
    with path.open("rb") as fh:
        for line in fh:
            at += len(line)
            if STEP_MARK in line:
                ends.append(at)
    return ends


class GrowingCopy:
    """The source run re-written into `folder` a step at a time, as a running job writes it."""

    def __init__(self, source: Path, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        manifest = json.loads((source / schema.MANIFEST_FILE).read_text())
        manifest["status"] = schema.RunStatus.RUNNING.value
        (folder / schema.MANIFEST_FILE).write_text(json.dumps(manifest))
        self.files = sorted(source.glob("rank-*.jsonl"))
        self.parts = [step_ends(path) for path in self.files]
        self.targets = [folder / path.name for path in self.files]
        for target in self.targets:
            target.write_bytes(b"")
        self.steps = 0  # steps written so far

    def grow(self, steps: int) -> None:
        """Append the next `steps` steps to every rank file."""
        for path, ends, target in zip(self.files, self.parts, self.targets, strict=True):
            start = ends[self.steps - 1] if self.steps else 0
            with path.open("rb") as source, target.open("ab") as fh:
                source.seek(start)
                fh.write(source.read(ends[self.steps + steps - 1] - start))
        self.steps += steps


def rss_mib() -> float:
    """The process's peak resident memory so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--at", default="100,1000,3000,10000", help="steps to measure at")
    parser.add_argument("--probes", type=int, default=5, help="single steps timed at each")
    parser.add_argument("--chunk", type=int, default=250, help="steps taken in at once between")
    parser.add_argument("--work", type=Path, default=Path("/tmp/diag-live-bench"))
    parser.add_argument("--baseline", action="store_true", help="also re-analyse the whole run")
    args = parser.parse_args()
    points = [int(p) for p in args.at.split(",")]
    assert points[-1] <= args.steps, "--at beyond --steps"
    source = args.work / f"source-{args.ranks}x{args.steps}"
    simulate(source, args.ranks, args.steps)
    folder = args.work / "growing"
    if folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    copy = GrowingCopy(source, folder)
    live = LiveRun(folder)
    manifest = live.manifest()
    assert manifest is not None
    print(f"{args.ranks} ranks, growing to {points[-1]} steps ({source})")
    print("step | update (take in) | analyse (run + diagnose) | total | peak RSS | re-analysis")
    for point in points:
        while copy.steps < point - args.probes:
            copy.grow(min(args.chunk, point - args.probes - copy.steps))
            live.update(manifest)
        updates, analyses = [], []
        for _ in range(args.probes):
            copy.grow(1)
            start = time.perf_counter()
            last = live.update(manifest)
            taken = time.perf_counter()
            diagnose(live.run())
            done = time.perf_counter()
            assert last == copy.steps - 1, (last, copy.steps)
            updates.append(taken - start)
            analyses.append(done - taken)
        update, analyse = statistics.median(updates), statistics.median(analyses)
        whole = ""
        if args.baseline:
            start = time.perf_counter()
            diagnose(load_any(folder))
            whole = f"{time.perf_counter() - start:.2f} s"
        print(f"{copy.steps:>6} | {update * 1e3:7.1f} ms | {analyse * 1e3:7.1f} ms | "
              f"{(update + analyse) * 1e3:7.1f} ms | {rss_mib():6.0f} MiB | {whole}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
