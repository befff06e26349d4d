"""A run analysed locally and on a Dask cluster: time, peak memory per worker, same report?

    python benchmarks/dask_cluster.py RUN [--workers 2] [--memory-limit 2GiB]

Starts a `LocalCluster` of `--workers` worker processes (one thread each, each capped at
`--memory-limit`: the nanny restarts a worker that goes over, and the analysis then fails), and
analyses RUN cold twice: in this machine's worker processes, then with `--scheduler` set to the
cluster. Each analysis starts without a cache (RUN/.diag-cache and the user cache entry are
removed first). Prints the wall time of each, the peak resident memory of each cluster worker
and of this process, and whether the two reports are equal.

For issue 15's 16,384-rank measurement:

    diag simulate --ranks 16384 --layout dp=256,tp=8,pp=8 --gpus-per-node 8 --steps 10 \\
        --microbatches 32 --out /tmp/run16k
    python benchmarks/dask_cluster.py /tmp/run16k
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CACHE_DIR = ".diag-cache"


def _peak_rss_bytes() -> int:
    """This process's peak resident memory since it started its program: /proc's VmHWM
    (getrusage's ru_maxrss carries a forked parent's peak across exec, so a worker started
    from a large process would report that process's peak)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _forget_caches(run: Path) -> None:
    from diag.read import cache

    shutil.rmtree(run / CACHE_DIR, ignore_errors=True)
    for place in cache._places(run):  # the user cache entry, when the folder was read-only
        if place.name != CACHE_DIR:
            shutil.rmtree(place, ignore_errors=True)


def _timed(run: Path, scheduler: str | None) -> tuple[dict[str, Any], float]:
    from diag.api import analyze_path
    from diag.read.parallel import using_scheduler

    _forget_caches(run)
    started = time.perf_counter()
    with using_scheduler(scheduler):
        report = analyze_path(run)
    return report, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    parser.add_argument("run", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="2GiB")
    args = parser.parse_args(argv)
    from distributed import Client, LocalCluster

    local, local_s = _timed(args.run, None)
    print(f"local analysis: {local_s:.1f} s", flush=True)
    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                           dashboard_address=None, memory_limit=args.memory_limit)  # fmt: skip
    with cluster:
        remote, remote_s = _timed(args.run, cluster.scheduler_address)
        with Client(cluster.scheduler_address) as client:
            peaks = client.run(_peak_rss_bytes)
    print(f"on the cluster ({args.workers} workers, {args.memory_limit} each): {remote_s:.1f} s")
    for worker, peak in sorted(peaks.items()):
        print(f"  worker {worker}: peak {peak / 2**30:.2f} GiB")
    print(f"this process (local workers' results and the analysis): peak "
          f"{_peak_rss_bytes() / 2**30:.2f} GiB")  # fmt: skip
    same = local == remote
    print(f"reports equal: {same}")
    if not same:
        differing = sorted(k for k in set(local) | set(remote) if local.get(k) != remote.get(k))
        print(f"  differing keys: {', '.join(differing)}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
