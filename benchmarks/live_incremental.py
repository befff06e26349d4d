"""The cost of one new step of a growing run, from step 100 to step 10,000 (issue 31, item 3):
what `diag watch` and `diag dashboard --live` pay each time every rank finishes a step, taking
it in and diagnosing the run so far (the total, per step, is the live view's whole cost).

    python benchmarks/live_incremental.py                     # 64 ranks, 10,000 steps
    python benchmarks/live_incremental.py --ranks 8 --steps 1000 --at 100,1000   # a quick look
    python benchmarks/live_incremental.py --baseline          # and a whole re-analysis at each

A simulated run (`diag simulate --ranks R --steps S --format jsonl`, written once into
`--work`) is replayed as a job writes it: a run directory whose manifest says `running` grows by
appending each step's lines to every rank file. Up to each step of `--at` it grows in chunks of
`--chunk` steps (taken in untimed); there, `--probes` single steps are appended one at a time and
each is timed: `update` (read the bytes appended, take in the step: its per-step tables) and
`analyse` (`LiveRun.run()` and `diagnose(run, derived=LiveRun.derived())`, as the dashboard
calls them: the whole-run view of every step so far, with what the rules would derive from the
events, kept as the steps came).
Printed per point: the medians, the resident memory, and with `--baseline` what the dashboard
paid before (a whole re-read and re-analysis of the run so far: `load_any` + `diagnose`).

The machine this project is built on has 2 cores that other work shares, and its speed varies
from minute to minute; so each probe is paired with one of a second copy of the run held at
about step 100 (`--reference`), timed right after it, and the ratio of the two medians is
printed too: the growth, measured under the same load.
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
    parser.add_argument("--at", default="100,1000,10000", help="steps to measure at")
    parser.add_argument("--probes", type=int, default=5, help="single steps timed at each")
    parser.add_argument("--chunk", type=int, default=250, help="steps taken in at once between")
    parser.add_argument("--work", type=Path, default=Path("/tmp/diag-live-bench"))
    parser.add_argument("--baseline", action="store_true", help="also re-analyse the whole run")
    parser.add_argument("--reference", type=int, default=100, help="the paired copy's step")
    args = parser.parse_args()
    points = [int(p) for p in args.at.split(",")]
    assert points[-1] <= args.steps, "--at beyond --steps"
    source = args.work / f"source-{args.ranks}x{args.steps}"
    simulate(source, args.ranks, args.steps)
    folder = args.work / "growing"
    if folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    copy = GrowingCopy(source, folder)
    reference = GrowingCopy(source, args.work / "reference")
    live, held = LiveRun(folder), LiveRun(args.work / "reference")
    manifest = live.manifest()
    assert manifest is not None
    grow(reference, held, manifest, args.reference - 1, args.chunk)
    print(f"{args.ranks} ranks, growing to {points[-1]} steps ({source}); medians of "
          f"{args.probes} steps, each paired with one at step ~{args.reference}")  # fmt: skip
    print(f"step | update (take in) | at ~{args.reference} | ratio | analyse (run + diagnose) | "
          f"whole step | at ~{args.reference} | ratio | peak RSS | re-analysis")  # fmt: skip
    for point in points:
        grow(copy, live, manifest, point - args.probes, args.chunk)
        timed: list[tuple[float, float]] = []
        paired: list[tuple[float, float]] = []
        for _ in range(args.probes):
            timed.append(one_step(copy, live, manifest))
            paired.append(one_step(reference, held, manifest))
        update = statistics.median(t[0] for t in timed)
        analyse = statistics.median(t[1] for t in timed)
        total = statistics.median(sum(t) for t in timed)
        base_update = statistics.median(t[0] for t in paired)
        base = statistics.median(sum(t) for t in paired)
        whole = ""
        if args.baseline:
            start = time.perf_counter()
            diagnose(load_any(folder))
            whole = f"{time.perf_counter() - start:.2f} s"
        print(f"{copy.steps:>6} | {update * 1e3:6.1f} ms | {base_update * 1e3:6.1f} ms | "
              f"{update / base_update:4.2f} | {analyse * 1e3:7.1f} ms | {total * 1e3:7.1f} ms | "
              f"{base * 1e3:7.1f} ms | {total / base:5.2f} | {rss_mib():6.0f} MiB | {whole}",
              flush=True)  # fmt: skip


def grow(copy: GrowingCopy, live: LiveRun, manifest: schema.Manifest, to: int, chunk: int) -> None:
    """Grow the copy to `to` steps, taken in `chunk` steps at a time (not timed)."""
    while copy.steps < to:
        copy.grow(min(chunk, to - copy.steps))
        live.update(manifest)


def one_step(copy: GrowingCopy, live: LiveRun, manifest: schema.Manifest) -> tuple[float, float]:
    """Append one step and time taking it in (`update`) and the whole-run diagnosis after."""
    copy.grow(1)
    start = time.perf_counter()
    last = live.update(manifest)
    taken = time.perf_counter()
    diagnose(live.run(), derived=live.derived())
    done = time.perf_counter()
    assert last == copy.steps - 1, (last, copy.steps)
    return taken - start, done - taken


if __name__ == "__main__":
    main()
