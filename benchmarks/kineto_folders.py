"""The trace folders benchmarks/kineto_load.py times, built here: its one job is to make them.

- `build_large`: the LARGE input, `ranks` gzipped copies of one real trace, each with its
  `distributedInfo.rank` and `world_size` rewritten;
- `build_generated`: a size class of `GENERATED`, written by `diag simulate --format kineto`
  (its correlation ids shifted as a profiler's are, `shift_correlations`) or, for the 4GB and
  30GB classes, by benchmarks/big_traces.py; kept in a folder that later runs reuse.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_DISTRIBUTED_INFO = re.compile(r'"distributedInfo"\s*:\s*\{[^{}]*\}')


def trace_files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".gz"))]


def build_large(source: Path, ranks: int, dest: Path) -> Path:
    """`ranks` gzipped copies of the source folder's single trace, rank r in copy r."""
    (trace,) = trace_files(source)
    opener = gzip.open if trace.name.endswith(".gz") else open
    with opener(trace, "rt", encoding="utf-8") as fh:
        text = fh.read()
    info = _DISTRIBUTED_INFO.search(text)
    if info is None:
        raise SystemExit(f"{trace}: no distributedInfo to rewrite")
    dest.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        new_info = re.sub(r'"rank":\s*\d+', f'"rank": {rank}', info.group(0))
        new_info = re.sub(r'"world_size":\s*\d+', f'"world_size": {ranks}', new_info)
        with gzip.open(dest / f"rank{rank}.json.gz", "wt", encoding="utf-8", compresslevel=1) as fh:
            fh.write(text[: info.start()])
            fh.write(new_info)
            fh.write(text[info.end() :])
    return dest


@dataclass(frozen=True)
class Generated:
    """A folder `diag simulate --format kineto` writes: its size class and how."""

    ranks: int
    layout: str
    steps: int
    gzipped: bool = False
    fast: bool = False  # built by big_traces.py (a few simulated steps, one repeated)

    def arguments(self, out: Path) -> list[str]:
        return ["simulate", "--ranks", str(self.ranks), "--layout", self.layout, "-m", "16",
                "--steps", str(self.steps), "--format", "kineto", "--out", str(out)]  # fmt: skip


GENERATED = {
    "279MB": Generated(16, "dp=4,pp=4", 250),
    "1.1GB": Generated(16, "dp=4,pp=4", 1000),
    "4GB": Generated(64, "dp=16,pp=4", 900, gzipped=True, fast=True),
    "30GB": Generated(64, "dp=16,pp=4", 7000, gzipped=True, fast=True),
}
"""Size classes of the issue's table (the 279 MB one was a real-timed Megatron job; here a
simulated folder of that size), and the opt-in 4 GB and 30 GB ones (JSON size before gzip;
built by benchmarks/big_traces.py in about a minute and eight minutes on two cores)."""


CORRELATION_BASE = 1_000_000
_CORRELATION = re.compile(rb'"correlation":\s*(\d+)')


def shift_correlations(trace: Path, gzipped: bool = False) -> None:
    """The simulator numbers a rank's correlation ids from 1; a profiler's come from a
    process-wide counter, far past 32,767 after warm-up. Shifted by CORRELATION_BASE, as HTA
    otherwise fails on a folder whose ids fit int16 but whose rows do not (it downcasts the
    column to int16, then stores row numbers in it: pandas 2 raises "Invalid value ... for
    dtype 'int16'", as on 250 steps of the 279MB class). diag reads either the same."""
    data = _CORRELATION.sub(
        lambda m: b'"correlation":%d' % (int(m.group(1)) + CORRELATION_BASE), trace.read_bytes()
    )
    if gzipped:
        with gzip.open(f"{trace}.gz", "wb", compresslevel=1) as fh:
            fh.write(data)
        trace.unlink()
    else:
        trace.write_bytes(data)


def build_generated(size: str, root: Path) -> Path:
    """The folder of size class `size` under `root`, made once (a `.complete` marker says it
    was finished) and reused by later runs."""
    spec = GENERATED[size]
    folder = root / f"sim-{size}"
    if (folder / ".complete").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if spec.fast:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from big_traces import build

        build(folder, spec.ranks, spec.layout, spec.steps)
        command = [sys.executable, "benchmarks/big_traces.py", str(folder), "--ranks",
                   str(spec.ranks), "--layout", spec.layout, "--steps",
                   str(spec.steps)]  # fmt: skip
        (folder / ".complete").write_text(" ".join(command[1:]) + "\n")
        print(f"\n{size}: generated in {time.perf_counter() - started:.0f} s: "
              f"python {' '.join(command[1:])}")  # fmt: skip
        return folder
    command = [sys.executable, "-m", "diag", *spec.arguments(folder)]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    for trace in sorted(folder.glob("*.json")):  # one at a time: the disk holds one more
        shift_correlations(trace, gzipped=spec.gzipped)
    (folder / ".complete").write_text(" ".join(command[2:]) + "\n")
    print(f"\n{size}: generated in {time.perf_counter() - started:.0f} s: "
          f"diag {' '.join(spec.arguments(folder))}")  # fmt: skip
    return folder
