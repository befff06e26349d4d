"""A command's memory, every process of it together, sampled while it runs.

    python benchmarks/tree_memory.py [--every 2] [--log FILE] -- diag analyze FOLDER ...

Runs the command and, every `--every` seconds, sums the RSS and the PSS (proportional: a page
a forked worker shares with its parent counted once between them) of the command's process
and all its descendants (process_tree.py). Prints one JSON
line at the end: exit status, wall time, the peaks of both sums, of the command's own process
and of its largest descendant. `--log` keeps every sample (the processes' RSS one by one).
What docs/scale.md's 30 GB row was measured with.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

try:
    from benchmarks.process_tree import KIB_PER_MIB, pss_kib, rss_kib, tree_pids
except ModuleNotFoundError:  # run as a script: benchmarks/ itself is on sys.path
    from process_tree import KIB_PER_MIB, pss_kib, rss_kib, tree_pids  # type: ignore[no-redef]


def measure(command: list[str], every_s: float, log: Path | None) -> dict[str, float]:
    started = time.monotonic()
    process = subprocess.Popen(command)
    peaks = {"rss_sum": 0, "pss_sum": 0, "main": 0, "largest_child": 0}
    out = open(log, "w") if log else None  # noqa: SIM115 (closed below)
    try:
        while process.poll() is None:
            tree = tree_pids(process.pid)
            rss = {pid: rss_kib(pid) for pid in tree}
            children = [kib for pid, kib in rss.items() if pid != process.pid]
            now = {
                "rss_sum": sum(rss.values()),
                "pss_sum": sum(map(pss_kib, tree)),
                "main": rss.get(process.pid, 0),
                "largest_child": max(children, default=0),
            }
            peaks = {name: max(peaks[name], now[name]) for name in peaks}
            if out is not None:
                shown = sorted((kib // KIB_PER_MIB for kib in children), reverse=True)
                print(f"{time.monotonic() - started:.0f}s rss_sum={now['rss_sum'] // 1024}MiB "
                      f"pss={now['pss_sum'] // 1024}MiB main={now['main'] // 1024} "
                      f"workers={shown}", file=out, flush=True)  # fmt: skip
            time.sleep(every_s)
    finally:
        if out is not None:
            out.close()
    return {
        "exit": process.returncode,
        "wall_s": round(time.monotonic() - started, 1),
        **{f"peak_{name}_mib": peaks[name] // KIB_PER_MIB for name in peaks},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--log", type=Path, help="write every sample here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command given (after --)")
    print(json.dumps(measure(command, options.every, options.log)))


if __name__ == "__main__":
    main()
