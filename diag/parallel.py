"""Parse many files in worker processes when there is enough work to pay for them.

Parsing JSON is CPU-bound Python, so threads do not help; processes do, at the price of a
start-up and of pickling the results back. Below `PARALLEL_MIN_BYTES` of input (a run of a few
dozen ranks) one process is faster. Workers are forked where the platform allows it (no
re-import of pandas); results keep the order of the inputs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

Result = TypeVar("Result")
PARALLEL_MIN_BYTES = 16 * 2**20
CHUNKS_PER_WORKER = 4
"""Files go to workers in a few chunks each: fewer round trips, still balanced."""


def workers() -> int:
    """CPU cores this process may use (`DIAG_WORKERS` overrides; 1 = no worker processes)."""
    forced = os.environ.get("DIAG_WORKERS", "").strip()
    if forced.isdigit() and int(forced) >= 1:
        return int(forced)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def map_files(
    parse: Callable[[int, Path], Result], files: Sequence[tuple[int, Path]]
) -> list[Result]:
    """`parse(key, path)` for every (key, path), in order, in parallel when it pays."""
    count = min(workers(), len(files))
    if count < 2 or _total_bytes(files) < PARALLEL_MIN_BYTES:
        return [parse(key, path) for key, path in files]
    size = max(1, len(files) // (count * CHUNKS_PER_WORKER))
    chunks = [files[i : i + size] for i in range(0, len(files), size)]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    try:
        with ProcessPoolExecutor(count, mp_context=context) as pool:
            parts = list(pool.map(_parse_chunk, [parse] * len(chunks), chunks))
    except (OSError, RuntimeError):  # no processes to be had (limits, sandbox): do it here
        return [parse(key, path) for key, path in files]
    return [result for part in parts for result in part]


def _parse_chunk(
    parse: Callable[[int, Path], Result], chunk: Sequence[tuple[int, Path]]
) -> list[Result]:
    return [parse(key, path) for key, path in chunk]


def _total_bytes(files: Sequence[tuple[int, Path]]) -> int:
    total = 0
    for _, path in files:
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total
