"""Flight Recorder dumps of a large job that hung: `diag analyze` of N ranks' dumps, each the
default buffer of 2,000 entries (TORCH_NCCL_TRACE_BUFFER_SIZE), one rank that never issued the
last all-reduce. Wall time, peak RSS, and whether the first finding names that rank.

    python benchmarks/fr_scale.py [--ranks 128 1024] [--entries 2000] [--keep DIR]

Each measurement runs `python -m diag analyze FOLDER --format json` in a fresh process, timed
by this one (peak RSS from `getrusage` of the finished child). The dumps are written here in
torch 2.13's JSON shape (`_dump_fr_trace_json`); `--keep DIR` keeps them for a later run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KIB_PER_MIB = 1024


def write_dumps(folder: Path, ranks: int, entries: int, missing: int) -> None:
    """`ranks` dumps of one default group; rank `missing` stops before the last all-reduce."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(ranks)))}}

    def entry(seq: int, done: bool) -> dict:
        return {"process_group": ["0", "default_pg"], "collective_seq_id": seq, "p2p_seq_id": 0,
                "is_p2p": False, "profiling_name": "nccl:all_reduce",
                "input_sizes": [[1024, 1024]], "input_dtypes": ["BFloat16"],
                "state": "completed" if done else "started", "retired": done,
                "time_created_ns": 10**18 + seq * 10**7, "timeout_ms": 600_000}  # fmt: skip

    for rank in range(ranks):
        listed = [entry(seq, True) for seq in range(1, entries)]
        if rank != missing:
            listed.append(entry(entries, False))
        dump = {"version": "2.10", "pg_config": config, "entries": listed}
        (folder / f"rank-{rank:05d}.json").write_text(json.dumps(dump))


def measure(folder: Path) -> tuple[float, float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "diag", "analyze", str(folder), "--format",
                           "json"], capture_output=True, text=True, check=False)  # fmt: skip
    wall_s = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode not in (0, 1):
        raise SystemExit(f"{folder}: diag analyze exited {done.returncode}: {done.stderr[-500:]}")
    # a peak below an earlier child's is not seen by getrusage: the ranks go in rising order
    return wall_s, max(peak_kib, before) / KIB_PER_MIB, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="fr-scale-"))
    print(f"{'ranks':>6} {'entries':>10} {'MiB on disk':>12} {'wall s':>8} {'peak MiB':>9}  first")
    for ranks in sorted(args.ranks):
        folder = root / f"fr-{ranks}x{args.entries}"
        missing = ranks * 3 // 4
        if not folder.is_dir():
            write_dumps(folder, ranks, args.entries, missing)
        size_mib = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        wall_s, peak_mib, report = measure(folder)
        first = report["findings"][0] if report["findings"] else {}
        named = f"names rank {missing}" if first.get("ranks") == [missing] else "WRONG"
        print(f"{ranks:>6} {ranks * args.entries:>10,} {size_mib:>12.0f} {wall_s:>8.1f} "
              f"{peak_mib:>9.0f}  {first.get('rule')} {named}")  # fmt: skip


if __name__ == "__main__":
    main()
