"""Kineto trace loading: diag's loader against HTA's, side by side in one run.

    python benchmarks/kineto_load.py [--repeats N] [--large-ranks N] [--large-repeats N]
        [--folders NAME ...] [--generated 279MB 1.1GB [30GB]] [--generated-dir DIR]

`--generated` adds folders made by `diag simulate --format kineto` (GENERATED below: the
279 MB and 1.1 GB classes are 16 ranks of `--layout dp=4,pp=4 -m 16`, 250 and 1,000 steps;
4GB and 30GB, opt-in and never in CI, are 64 ranks x 900 and x 7,000 steps of `--layout
dp=16,pp=4 -m 16`, built fast by benchmarks/big_traces.py and gzipped as written). They
are kept in `--generated-dir` (default: a temporary folder) so a later run reuses them, and
measured once each (`--generated-repeats`), cold, paired: `diag`'s load and metrics against
HTA's `TraceAnalysis` plus its temporal breakdown, wall time and peak RSS side by side.
`--folders` with no name and `--large-ranks 0` measure the generated folders alone;
`--ours-only` leaves HTA out (at 30 GB it would need tens of GiB) and `--child-timeout`
gives each measurement longer than ten minutes.

For every trace folder of ../shared/real-traces (see its README; `--traces DIR` elsewhere;
`--folders hta-large-216k-events --large-ranks 0` for the 216k-event trace alone),
plus one LARGE folder built here (the 216k-event trace copied `--large-ranks` times into a
temporary folder, `distributedInfo.rank` rewritten to 0..N-1 and `world_size` to N, gzipped),
it measures:

1. cold analysis: `load_trace_dir(use_cache=False, breakdown=reduce_rank_files)` (as `diag
   analyze` loads: a folder over 128 MiB reduced, kineto/window.py) + `compute_metrics` (ours)
   against `hta.trace_analysis.TraceAnalysis(trace_dir=...)` (HTA), seconds, and HTA/ours
   (goal >= 5x);
2. peak memory of that cold analysis, MiB: the measuring process's own high-water RSS
   (VmHWM) and the largest max RSS among its finished children (both loaders parse several
   files in forked workers), read right after the cold analysis: the largest one process
   (issue 43's measure; goal: ours <= 0.5x HTA's); and, in one more cold run of each that is
   not timed, the summed RSS of the process and all its descendants, sampled every 50 ms
   (`TreeRss`: every process together, pages a forked worker shares with its parent counted
   in both). The timed runs sample nothing: the sampler's reads of /proc cost a 1.5 s
   analysis 10-20% of its time on two cores;
3. second analysis: ours served from diag's cache (a first `analyze_path` writes the tables
   and the report beside the traces; the timed call is the whole `analyze_path` again, which
   finds the report for the unchanged traces, code and options) against HTA's re-parse (a
   second `TraceAnalysis` in the same process, as HTA keeps no cache), HTA/ours (goal >= 10x).

Every measurement runs in a fresh Python process (this file with `--child`, which runs
kineto_child.py), so imports, caches and the allocator of one never help the next; import time
is not counted (what the loaders import later, numba for one, is). Ours and HTA alternate, a
round of each at a time, so both see the same load on a shared machine. Each timing is repeated
`--repeats` times (the LARGE folder `--large-repeats` times, to stay near five minutes on two
cores) and shown as the median and the spread (max / min). diag's cache goes to a temporary
`XDG_CACHE_HOME` (the real traces are read-only) or beside the LARGE folder's copies; nothing
is written to the real traces. A folder HTA cannot load is reported in one line and its HTA
columns are left empty."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from benchmarks.kineto_child import child_main
    from benchmarks.kineto_folders import GENERATED, build_generated, build_large, trace_files
except ModuleNotFoundError:  # run as a script: benchmarks/ itself is on sys.path
    from kineto_child import child_main  # type: ignore[no-redef]
    from kineto_folders import (  # type: ignore[no-redef]
        GENERATED,
        build_generated,
        build_large,
        trace_files,
    )

REPO = Path(__file__).resolve().parents[1]
REAL_TRACES = REPO.parent / "shared" / "real-traces"
FOLDERS = (
    "hta-nccl-world2",
    "hta-sampled-world128",
    "hta-alltoall-world16",
    "hta-large-216k-events",
    "deepseek-v3-train-ep64",
    "hta-cpu-only-gloo",
    "hta-no-distributed-info",
)
LARGE_SOURCE = "hta-large-216k-events"
COLD_GOAL_X = 5.0
PEAK_GOAL_SHARE = 0.5
"""ours' peak memory at most this share of HTA's."""
CACHE_GOAL_X = 10.0
CHILD_TIMEOUT_S = 600


# ---------------------------------------------------------------- parent side


@dataclass
class Measured:
    """One loader's samples on one folder."""

    cold_s: list[float] = field(default_factory=list)
    peak_mib: list[float] = field(default_factory=list)  # own + children, per cold run
    own_mib: list[float] = field(default_factory=list)
    children_mib: list[float] = field(default_factory=list)
    largest_mib: list[float] = field(default_factory=list)  # the largest one process's max RSS
    tree_mib: list[float] = field(default_factory=list)  # every process together, sampled
    tree_pss_mib: list[float] = field(default_factory=list)  # the same, proportional (PSS)
    second_s: list[float] = field(default_factory=list)
    cold_metrics_s: list[float] = field(default_factory=list)  # ours: the metrics' share
    second_metrics_s: list[float] = field(default_factory=list)
    cache_hit: bool | None = None
    error: str | None = None


@dataclass
class FolderResult:
    name: str
    files: int
    disk_mib: float
    repeats: int
    ours: Measured
    hta: Measured
    load: str = ""  # the machine's load average around the measurement


def _run_child(
    kind: str, folder: Path, second_repeats: int, env: dict[str, str], sample: bool = False
) -> dict:
    timeout_s = int(env.get("KINETO_LOAD_CHILD_TIMEOUT_S", CHILD_TIMEOUT_S))
    with tempfile.TemporaryDirectory(prefix="kineto-bench-out-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(folder),
                   "--second", str(second_repeats), "--out", str(out),
                   *(["--sample-tree"] if sample else [])]  # fmt: skip
        try:
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s} s"}
        if out.exists():
            return json.loads(out.read_text())
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"error": tail[:160]}


def _add(measured: Measured, result: dict[str, Any]) -> None:
    """One timed child's figures added to its loader's samples (or its error kept)."""
    if "error" in result:
        measured.error = measured.error or result["error"]
        return
    measured.cold_s.append(result["cold_s"])
    measured.own_mib.append(result["own_mib"])
    measured.children_mib.append(result["children_mib"])
    measured.peak_mib.append(result["own_mib"] + result["children_mib"])
    measured.largest_mib.append(max(result["own_mib"], result["children_mib"]))
    measured.second_s += result["second_s"]
    measured.cold_metrics_s += result.get("cold_metrics_s", [])
    measured.second_metrics_s += result.get("second_metrics_s", [])
    if result.get("cache_hit") is not None:
        measured.cache_hit = result["cache_hit"]


def _add_sampled(measured: Measured, result: dict[str, Any]) -> None:
    """A sampling child's memory of every process together (its time is not one of the
    timings: the sampling slows what it samples)."""
    if "error" in result:
        measured.error = measured.error or result["error"]
        return
    measured.tree_mib.append(result["tree_mib"])
    measured.tree_pss_mib.append(result["tree_pss_mib"])


def measure_folder(
    name: str,
    folder: Path,
    repeats: int,
    env: dict[str, str],
    *,
    generated: bool = False,
    hta: bool = True,
) -> FolderResult:
    """`repeats` rounds, each a cold run of ours then one of HTA, in fresh processes (paired:
    a round's two runs see the same load on the machine). Ours' first process then times
    `repeats` cached analyses; every HTA process times one second construction. A
    `generated` folder: cold runs only, HTA with its temporal breakdown (the issue's pairing).
    Then one more cold run of each samples the memory of all its processes together (untimed)."""
    files = trace_files(folder)
    disk_mib = sum(p.stat().st_size for p in files) / 2**20
    ours, theirs = Measured(), Measured()
    if not hta:
        theirs.error = "not measured (--ours-only)"
    load = _load_average()
    for index in range(repeats):
        if not ours.error:
            second = 0 if generated else (repeats if index == 0 else 0)
            _add(ours, _run_child("ours", folder, second, env))
        if not theirs.error:
            _add(theirs, _run_child("hta-breakdown" if generated else "hta", folder,
                                 0 if generated else 1, env))  # fmt: skip
    if not ours.error:
        _add_sampled(ours, _run_child("ours", folder, 0, env, sample=True))
    if not theirs.error:
        _add_sampled(theirs, _run_child("hta-breakdown" if generated else "hta", folder, 0, env,
                                        sample=True))  # fmt: skip
    return FolderResult(name, len(files), disk_mib, repeats, ours, theirs,
                        f"{load} before, {_load_average()} after")  # fmt: skip


# ---------------------------------------------------------------- printing


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return "n=1"
    return f"x{max(values) / min(values):.2f}"


def _seconds(values: list[float]) -> str:
    return f"{_median(values):6.3f} s {_spread(values):>5}" if values else f"{'-':>14}"


def _ratio(hta: list[float], ours: list[float]) -> float | None:
    if not hta or not ours or _median(ours) <= 0:
        return None
    return _median(hta) / _median(ours)


def _ratio_text(ratio: float | None) -> str:
    return f"{ratio:.1f}x" if ratio is not None else "-"


def _memory(measured: Measured) -> str:
    if not measured.peak_mib:
        return "-"
    return (f"{_median(measured.peak_mib):.0f} (self {_median(measured.own_mib):.0f}"
            f" + children {_median(measured.children_mib):.0f}; all processes together"
            f" {_median(measured.tree_mib):.0f}, proportional"
            f" {_median(measured.tree_pss_mib):.0f})")  # fmt: skip


def print_folder(result: FolderResult) -> None:
    """Median seconds, spread (max / min) and, in brackets, the metrics' share of ours."""
    ours, hta = result.ours, result.hta
    print(f"\n{result.name}: {result.files} file(s), {result.disk_mib:.1f} MiB on disk, "
          f"{result.repeats} repeat(s); {result.load}")  # fmt: skip
    if ours.error:
        print(f"  ours failed: {ours.error}")
        return
    if hta.error:
        print(f"  HTA skipped: {hta.error}")
    cold_metrics_s = _median(ours.cold_metrics_s)
    print(f"  cold    ours {_seconds(ours.cold_s)} [metrics {cold_metrics_s:.3f}]"
          f"  HTA {_seconds(hta.cold_s)}  HTA/ours "
          f"{_ratio_text(_ratio(hta.cold_s, ours.cold_s))}")  # fmt: skip
    share = _ratio(ours.peak_mib, hta.peak_mib)
    print(f"  peak    ours {_memory(ours)} MiB  HTA {_memory(hta)} MiB  ours/HTA "
          f"{f'{share:.2f}' if share is not None else '-'}")  # fmt: skip
    hit = {True: "cache hit", False: "CACHE MISS", None: "?"}[ours.cache_hit]
    second_metrics_s = _median(ours.second_metrics_s) if ours.second_metrics_s else 0.0
    print(f"  second  ours {_seconds(ours.second_s)} [metrics {second_metrics_s:.3f}, {hit}]"
          f"  HTA {_seconds(hta.second_s)}  HTA/ours "
          f"{_ratio_text(_ratio(hta.second_s, ours.second_s))}")  # fmt: skip


def _goal(ratio: float | None, goal: float) -> str:
    if ratio is None:
        return "  -"
    return "yes" if ratio >= goal else " NO"


def print_table(results: list[FolderResult], cores: str) -> None:
    print(f"\nSummary ({cores}); goals: cold HTA/ours >= {COLD_GOAL_X:g}x, peak ours <= "
          f"{PEAK_GOAL_SHARE:g}x HTA's, cached HTA/ours >= {CACHE_GOAL_X:g}x")  # fmt: skip
    header = (f"{'folder':<26}{'n':>3} {'cold':>8} {'met':>4}  {'ours MiB':>8} {'HTA MiB':>8}"
              f" {'met':>4}  {'largest':>15} {'met':>4}  {'cached':>8} {'met':>4}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for r in results:
        if r.ours.error:
            print(f"{r.name:<26}{r.repeats:>3} ours failed")
            continue
        cold = _ratio(r.hta.cold_s, r.ours.cold_s)
        second = _ratio(r.hta.second_s, r.ours.second_s)
        ours_mib, hta_mib = (
            _median(r.ours.tree_mib),
            (_median(r.hta.tree_mib) if r.hta.tree_mib else None),
        )
        met = hta_mib is not None and ours_mib <= PEAK_GOAL_SHARE * hta_mib
        mem_met = "  -" if hta_mib is None else ("yes" if met else " NO")
        hta_text = f"{hta_mib:8.0f}" if hta_mib is not None else f"{'-':>8}"
        largest, largest_met = _largest(r)
        print(f"{r.name:<26}{r.repeats:>3} {_ratio_text(cold):>8} {_goal(cold, COLD_GOAL_X):>4}"
              f"  {ours_mib:8.0f} {hta_text} {mem_met:>4}  {largest:>15} {largest_met:>4}"
              f"  {_ratio_text(second):>8} {_goal(second, CACHE_GOAL_X):>4}")  # fmt: skip
    print("(n: repeats; cold/cached: HTA time / ours; MiB: median peak of every process "
          "together, sampled; largest: the largest one process's max RSS, ours / HTA's, as "
          "issue 43's table measured it)")  # fmt: skip


def _largest(result: FolderResult) -> tuple[str, str]:
    """`ours / HTA's` largest one process (MiB), and whether ours is within the goal."""
    if not result.ours.largest_mib or not result.hta.largest_mib:
        return "-", "  -"
    ours, hta = _median(result.ours.largest_mib), _median(result.hta.largest_mib)
    return f"{ours:.0f} / {hta:.0f}", "yes" if ours <= PEAK_GOAL_SHARE * hta else " NO"


# ---------------------------------------------------------------- main


def _cores() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return f"{os.cpu_count()} cores, {usable} usable"


def _load_average() -> str:
    """Other processes' load: on a shared machine it explains noisy timings."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timings per folder (3)")
    parser.add_argument("--large-ranks", type=int, default=8, help="ranks of the LARGE input")
    parser.add_argument("--large-repeats", type=int, default=1, help="timings of LARGE (1)")
    parser.add_argument("--traces", type=Path, default=REAL_TRACES, help="real-traces folder")
    parser.add_argument("--folders", nargs="*", default=list(FOLDERS), metavar="NAME",
                        help="these folders of --traces only (default: all)")  # fmt: skip
    parser.add_argument("--generated", nargs="+", default=[], choices=list(GENERATED),
                        help="simulated folders of these size classes (30GB: opt-in)")  # fmt: skip
    parser.add_argument("--generated-dir", type=Path, help="where they are kept (reused)")
    parser.add_argument("--generated-repeats", type=int, default=1, help="timings of each (1)")
    parser.add_argument(
        "--ours-only",
        action="store_true",
        help="generated folders: diag alone (HTA needs tens of GiB at 30GB)",
    )
    parser.add_argument(
        "--child-timeout",
        type=int,
        default=CHILD_TIMEOUT_S,
        help=f"seconds one measurement may take ({CHILD_TIMEOUT_S})",
    )
    parser.add_argument("--child", nargs=2, metavar=("KIND", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--second", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--sample-tree", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.child:
        child_main(args.child[0], Path(args.child[1]), args.second, args.out, args.sample_tree)
        return 0
    started = time.perf_counter()
    cores = _cores()
    print(f"Kineto load benchmark: diag vs HTA; {cores}; python {sys.version.split()[0]}; "
          f"{_load_average()}")  # fmt: skip
    print(f"repeats: {args.repeats} per folder, {args.large_repeats} for LARGE "
          f"({args.large_ranks} ranks; fewer to keep the run near five minutes)")  # fmt: skip
    results: list[FolderResult] = []
    with tempfile.TemporaryDirectory(prefix="kineto-bench-") as tmp:
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "xdg-cache"),
               "KINETO_LOAD_CHILD_TIMEOUT_S": str(args.child_timeout)}  # fmt: skip
        for name in args.folders:
            folder = args.traces / name
            if not folder.is_dir():
                print(f"\n{name}: not found under {args.traces} (skipped)")
                continue
            results.append(measure_folder(name, folder, args.repeats, env))
            print_folder(results[-1])
        source = args.traces / LARGE_SOURCE
        if source.is_dir() and args.large_ranks > 0:
            build_started = time.perf_counter()
            large = build_large(source, args.large_ranks, Path(tmp) / "large")
            print(f"\nLARGE: built {args.large_ranks} ranks of {LARGE_SOURCE} in "
                  f"{time.perf_counter() - build_started:.1f} s")  # fmt: skip
            name = f"LARGE-{args.large_ranks}x216k"
            results.append(measure_folder(name, large, args.large_repeats, env))
            print_folder(results[-1])
            shutil.rmtree(large, ignore_errors=True)
        kept = args.generated_dir or Path(tmp) / "generated"
        for size in args.generated:
            folder = build_generated(size, kept)
            results.append(measure_folder(f"sim-{size}", folder, args.generated_repeats, env,
                                          generated=True, hta=not args.ours_only))  # fmt: skip
            print_folder(results[-1])
    print_table(results, cores)
    print(f"total {time.perf_counter() - started:.0f} s; {_load_average()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
