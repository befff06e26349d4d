"""Big Kineto trace folders built fast: a few simulated steps, one of them repeated.

    python benchmarks/big_traces.py OUT --ranks 64 --layout dp=16,pp=4 --steps 7000 [--jobs 2]

`diag simulate --format kineto` times every event of every step, which takes minutes per
gigabyte. Here it simulates SEED_STEPS steps only; each rank's file then keeps its steps 0
and 1 as simulated (the warm-up and a first analysed step) and repeats its step 2 for steps
2..N-1: the step's events (the CPU events that start in its `ProfilerStep` window and the
kernels those launched, by correlation id) with their start shifted by one period per copy,
the same for every rank (the longest rank's step 2 to step 3, rounded up to a microsecond;
so each copy keeps the ranks' relative timing, its waits and its late arrivals), their
correlation ids shifted past the previous copy's, and `ProfilerStep#N` numbered. Collective
sequence numbers are not written by the simulator (diag numbers each group's collectives by
start), so there are none to shift. Each rank's file is written gzipped
(`*.pt.trace.json.gz`, level 1) as it is made: a copy is one `%` formatting of its events'
text with their shifted numbers, so the output is bounded by gzip and the disk.

`build(out, ranks, layout, steps)` is what `benchmarks/kineto_load.py --generated 30GB` calls.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SEED_STEPS = 4
"""Simulated steps: 0 (warm-up), 1, 2 (the repeated one) and 3 (its end: the period)."""
REPEATED = 2
CORRELATION_BASE = 1_000_000
"""Ids start past int16 (a profiler's come from a process-wide counter; HTA downcasts small
ones and then fails, see kineto_folders.shift_correlations)."""
_TS, _CORR, _STEP = "@@ts@@", "@@corr@@", "@@step@@"


def simulate(seed: Path, ranks: int, layout: str, micro_batches: int) -> list[Path]:
    """SEED_STEPS simulated steps of the job, one `.json` per rank."""
    shutil.rmtree(seed, ignore_errors=True)
    command = [sys.executable, "-m", "diag", "simulate", "--ranks", str(ranks), "--layout",
               layout, "-m", str(micro_batches), "--steps", str(SEED_STEPS), "--format",
               "kineto", "--out", str(seed)]  # fmt: skip
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    return sorted(seed.glob("*.json"))


def _steps(events: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    found = {}
    for event in events:
        name = str(event.get("name", ""))
        if name.startswith("ProfilerStep#") and event.get("cat") != "gpu_user_annotation":
            found[int(name.split("#")[1])] = (event["ts"], event["ts"] + event.get("dur", 0))
    return found


def period_us(traces: list[Path]) -> int:
    """The longest rank's step REPEATED to step REPEATED + 1, in whole microseconds."""
    longest = 0.0
    for trace in traces:
        steps = _steps(json.loads(trace.read_bytes())["traceEvents"])
        longest = max(longest, steps[REPEATED + 1][0] - steps[REPEATED][0])
    return math.ceil(longest) + 1


def _split(events: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """(events kept as simulated: before step REPEATED, events of step REPEATED): a CPU event
    by where it starts, a kernel by where its launch starts (correlation)."""
    steps = _steps(events)
    start, end = steps[REPEATED][0], steps[REPEATED + 1][0]
    launched_in: dict[int, float] = {}
    for event in events:
        correlation = (event.get("args") or {}).get("correlation")
        if event.get("cat") in ("cuda_runtime", "cuda_driver") and correlation is not None:
            launched_in[correlation] = event["ts"]
    kept, repeated = [], []
    for event in events:
        at = event["ts"]
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            at = launched_in.get((event.get("args") or {}).get("correlation"), at)
        if at < start:
            kept.append(event)
        elif at < end:
            repeated.append(event)
    return kept, repeated


def _template(events: list[dict[str, Any]]) -> tuple[str, list[tuple[str, int]]]:
    """The events' text with `%d` where a copy's numbers go, and per placeholder (what, base)."""
    texts, slots = [], []
    for event in events:
        event = json.loads(json.dumps(event))
        fields: list[tuple[str, int]] = []
        whole = math.floor(event["ts"])
        fraction = f"{event['ts']:.3f}".split(".")[1]
        event["ts"] = _TS
        fields.append(("ts", whole))
        args = event.get("args") or {}
        if "correlation" in args:
            fields.append(("corr", int(args["correlation"])))
            args["correlation"] = _CORR
        name = str(event.get("name", ""))
        if name.startswith("ProfilerStep#"):
            event["name"] = "ProfilerStep#" + _STEP
            fields.append(("step", 0))
        text = json.dumps(event, separators=(",", ":")).replace("%", "%%")
        # the values go in the placeholders' order in the text
        where = {"ts": f'"{_TS}"', "corr": f'"{_CORR}"', "step": _STEP}
        slots += sorted(fields, key=lambda f: text.index(where[f[0]]))
        text = text.replace(f'"{_TS}"', f"%d.{fraction}").replace(f'"{_CORR}"', "%d")
        texts.append(text.replace(_STEP, "%d"))
    return ",".join(texts), slots


def _shifted(events: list[dict[str, Any]], corr_shift: int) -> list[dict[str, Any]]:
    for event in events:
        args = event.get("args") or {}
        if "correlation" in args:
            args["correlation"] += corr_shift
    return events


def write_rank(trace: Path, out: Path, steps: int, period: int, plain: bool = False) -> int:
    """The rank's file of `steps` steps, gzipped (`plain`: not); its inflated size in bytes."""
    data = json.loads(trace.read_bytes())
    events = _shifted(data.pop("traceEvents"), CORRELATION_BASE)
    kept, repeated = _split(events)
    correlations = [(e.get("args") or {}).get("correlation") for e in events]
    corr_span = max([c for c in correlations if isinstance(c, int)], default=0) + 1
    template, slots = _template(repeated)
    kinds = [kind for kind, _ in slots]
    bases = [base for _, base in slots]
    per_copy = {"ts": period, "corr": corr_span, "step": 1}
    deltas = [per_copy[kind] for kind in kinds]
    step_slots = [i for i, kind in enumerate(kinds) if kind == "step"]
    head = json.dumps({**data, "traceEvents": []}, separators=(",", ":"))
    opening, closing = head.split('"traceEvents":[]')
    size = 0
    name = out / (trace.name + ("" if plain else ".gz"))
    opened = open_text(name, plain)
    with opened as fh:

        def put(text: str) -> None:
            nonlocal size
            size += len(text)
            fh.write(text)

        put(opening + '"traceEvents":[')
        put(",".join(json.dumps(e, separators=(",", ":")) for e in kept))
        for copy in range(steps - REPEATED):
            values = [base + copy * delta for base, delta in zip(bases, deltas, strict=True)]
            for i in step_slots:
                values[i] = REPEATED + copy
            put("," + template % tuple(values))
        put("]" + closing)
    return size


def open_text(name: Path, plain: bool) -> Any:
    """`name` opened for writing text, gzipped unless `plain`."""
    if plain:
        return name.open("w", encoding="utf-8")
    return gzip.open(name, "wt", compresslevel=1, encoding="utf-8")


def build(out: Path, ranks: int, layout: str, steps: int, micro_batches: int = 16,
          jobs: int = 2, plain: bool = False) -> int:  # fmt: skip
    """The folder `out` (made anew), one gzipped trace per rank of `steps` steps (`plain`:
    not gzipped); returns the inflated JSON bytes written."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    seed = out.with_name(out.name + ".seed")
    traces = simulate(seed, ranks, layout, micro_batches)
    period = period_us(traces)
    with ProcessPoolExecutor(jobs) as pool:
        sizes = list(pool.map(write_rank, traces, [out] * len(traces), [steps] * len(traces),
                              [period] * len(traces), [plain] * len(traces)))  # fmt: skip
    shutil.rmtree(seed, ignore_errors=True)
    return sum(sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--layout", default="dp=16,pp=4")
    parser.add_argument("--steps", type=int, default=7000)
    parser.add_argument("-m", "--micro-batches", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--plain", action="store_true", help="write .json, not .json.gz")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    size = build(args.out, args.ranks, args.layout, args.steps, args.micro_batches, args.jobs,
                 args.plain)  # fmt: skip
    disk = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{args.out}: {args.ranks} ranks x {args.steps} steps, {size / 1e9:.2f} GB of JSON, "
          f"{disk / 1e9:.2f} GB on disk, in {time.perf_counter() - started:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
