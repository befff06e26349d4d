"""The memory of a process and every process it started, sampled: `TreeRss` (the analysis
measured in its own process, benchmarks/kineto_load.py) and the pieces a sampler from outside
reads (benchmarks/tree_memory.py). Linux only: /proc."""

from __future__ import annotations

import os
import threading
from pathlib import Path

KIB_PER_MIB = 1024


class TreeRss(threading.Thread):
    """The summed RSS of this process and all its descendants, sampled every SAMPLE_S while
    running: the memory of every process of an analysis together (pages a forked worker
    shares with its parent counted in both: an upper bound)."""

    SAMPLE_S = 0.05

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_kib = 0
        self.peak_pss_kib = 0  # proportional: a page shared by n processes counted 1/n each
        self.done = threading.Event()

    def sample(self) -> None:
        tree = tree_pids(os.getpid())
        self.peak_kib = max(self.peak_kib, sum(map(rss_kib, tree)))
        self.peak_pss_kib = max(self.peak_pss_kib, sum(map(pss_kib, tree)))

    def run(self) -> None:
        while not self.done.wait(self.SAMPLE_S):
            self.sample()

    def stop(self) -> float:
        """Stop sampling; the peak in MiB."""
        self.sample()
        self.done.set()
        self.join()
        return self.peak_kib / KIB_PER_MIB


def tree_pids(pid: int) -> list[int]:
    """`pid` and its descendants (Linux: /proc/PID/task/TID/children)."""
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        found.append(here)
        for task in Path(f"/proc/{here}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def rss_kib(pid: int) -> int:
    """The process's resident set size, KiB; 0 where the kernel does not say."""
    return _proc_kib(f"/proc/{pid}/status", "VmRSS:")


def pss_kib(pid: int) -> int:
    """The process's proportional set size (a forked worker's pages shared with its parent
    counted once between them), KiB; 0 where the kernel does not say."""
    return _proc_kib(f"/proc/{pid}/smaps_rollup", "Pss:")


def _proc_kib(path: str, field: str) -> int:
    """The KiB of the line of a /proc file that starts with `field`; 0 without one."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
