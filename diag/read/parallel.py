"""Parse many files in worker processes when there is enough work to pay for them.

Parsing JSON is CPU-bound Python, so threads do not help; processes do, at the price of a
start-up and of pickling the results back. Below `PARALLEL_MIN_BYTES` of input (a run of a few
dozen ranks) one process is faster. Workers are forked where the platform allows it (no
re-import of pandas); results keep the order of the inputs.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from diag.read.progress import Progress

if TYPE_CHECKING:
    from diag.read.memory_budget import Admission

Result = TypeVar("Result")
PARALLEL_MIN_BYTES = 16 * 2**20
CHUNKS_PER_WORKER = 4
"""Files go to workers in chunks of a share of what is left (`chunk_bounds`): few round trips,
the last chunks small enough that the workers finish together."""
MAX_CHUNK_FILES = 64
"""At most this many rank files a chunk: what one worker holds at once, however large the run."""


def workers() -> int:
    """CPU cores this process may use (`DIAG_WORKERS` overrides; 1 = no worker processes)."""
    forced = os.environ.get("DIAG_WORKERS", "").strip()
    if forced.isdigit() and int(forced) >= 1:
        return int(forced)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
_scheduler: str | None = None


def scheduler_address() -> str | None:
    """The Dask scheduler the per-file work goes to: `using_scheduler`'s, else the
    environment's DASK_SCHEDULER_ADDRESS, else None (local processes)."""
    return _scheduler or os.environ.get(SCHEDULER_ENV, "").strip() or None


def use_scheduler(address: str | None) -> None:
    """From now on, send every `map_chunks` to the Dask scheduler at `address` (None: leave
    the choice to the environment); what `diag analyze --scheduler` sets."""
    global _scheduler
    _scheduler = address


@contextlib.contextmanager
def using_scheduler(address: str | None) -> Iterator[None]:
    """Within the block, send every `map_chunks` to the Dask scheduler at `address` (None:
    leave the choice to the environment)."""
    global _scheduler
    before, _scheduler = _scheduler, address or _scheduler
    try:
        yield
    finally:
        _scheduler = before


def map_chunks(
    parse: Callable[[list[tuple[int, Path]]], Result],
    files: Sequence[tuple[int, Path]],
    *,
    count: int | None = None,
    min_bytes: int | None = None,
    chunk_files: int = MAX_CHUNK_FILES,
    progress: str | None = None,
    cluster: bool = True,
    admission: Admission | None = None,
) -> list[Result]:
    """`parse(chunk)` for consecutive chunks of (key, path) that cover `files` in order, in
    worker processes when there are `min_bytes` to parse (default PARALLEL_MIN_BYTES; `count`
    forces the number of processes), or on the Dask cluster of `scheduler_address()` (unless
    `cluster` is False: a `parse` that writes this machine's files). A chunk holds at most
    `chunk_files` files, so a worker's memory does not grow with the run. `progress`: what
    the files are called ("trace files") in the line of progress a long read shows on a
    terminal (`diag.read.progress`), updated as chunks finish; None: no line. `admission`:
    which chunk may start beside those in flight (memory_budget.py; None: all are queued at
    once), in order; it sees the chunks' indices."""
    forced = count is not None
    count = min(count or workers(), len(files))
    threshold = PARALLEL_MIN_BYTES if min_bytes is None else min_bytes
    sizes = file_sizes(files)
    parallel = count >= 2 and (forced or sum(sizes) >= threshold)
    chunks, chunk_done = planned(files, count, chunk_files, progress, sizes)
    address = scheduler_address() if cluster else None
    if address is not None and chunks:
        from diag.read.distributed_scheduler import map_on_cluster  # Dask only when asked for

        return map_on_cluster(address, parse, chunks, done=chunk_done)
    if not parallel:
        return _here(parse, chunks, chunk_done)
    with out_of_collection():
        return _in_pool(parse, chunks, chunk_done, count, admission, _largest_first(chunks, sizes))


@contextlib.contextmanager
def out_of_collection() -> Iterator[None]:
    """Every object alive now out of the cycle collector's reach while forked workers run
    (`gc.freeze`, as Python's documentation advises before a fork): a worker's full
    collection (`_release_freed`, after each chunk) no longer walks the modules and tables it
    inherits, nor does this process's as results arrive. Forked after a trace folder's load,
    the reducing workers spent 60% of their time in those collections (0.74 of 1.2 CPU s,
    the 279 MB-class folder). Given back to the collector afterwards, so that a long-running
    process frees them when they go; inside another such block, left to that one."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _largest_first(chunks: list[list[tuple[int, Path]]], sizes: list[int]) -> list[int]:
    """The chunks' indices by their files' bytes, largest first (ties in order): started so,
    the last to finish are the small ones, and no worker idles long beside the last large one
    (a folder's traces differ: a pipeline's last stage, a rank that holds the experts)."""
    ends = list(accumulate(len(chunk) for chunk in chunks))
    bytes_of = [sum(sizes[end - len(chunk) : end]) for chunk, end in zip(chunks, ends, strict=True)]
    return sorted(range(len(chunks)), key=lambda index: -bytes_of[index])


def _in_pool(
    parse: Callable[[list[tuple[int, Path]]], Result],
    chunks: list[list[tuple[int, Path]]],
    chunk_done: Callable[[int], None],
    count: int,
    admission: Admission | None,
    order: list[int],
) -> list[Result]:
    """Every chunk parsed by `count` forked worker processes (map_chunks), started in `order`
    (their results in theirs)."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    results: list[Result | None] = [None] * len(chunks)
    try:
        pool = ProcessPoolExecutor(
            count, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)
        )
    except (OSError, RuntimeError):  # no processes to be had (limits, sandbox): do it here
        return _here(parse, chunks, chunk_done)
    try:
        waiting = deque(order)
        pending: dict[Future[Result], int] = {}
        while waiting or pending:
            while waiting and (
                admission is None
                or (len(pending) < count and admission.admits(waiting[0], pending.values()))
            ):
                index = waiting.popleft()
                pending[pool.submit(_in_worker, parse, chunks[index])] = index
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                index = pending.pop(future)
                results[index] = future.result()
                chunk_done(index)
    except (OSError, RuntimeError):  # no processes to be had (limits, sandbox): do it here
        _stopped(pool)
        return _here(parse, chunks, chunk_done)
    except BaseException:  # Ctrl-C, SIGTERM (scratch.py), a worker's error: stop at once
        _stopped(pool)
        raise
    pool.shutdown()
    return [result for result in results if result is not None]


def _stopped(pool: ProcessPoolExecutor) -> None:
    """The pool's queued chunks cancelled and its workers ended now, not once the chunks they
    are parsing are done (`shutdown(wait=True)` alone waits for them: minutes on a large
    trace after Ctrl-C)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # private: defensively
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        if process.is_alive():
            process.terminate()
    pool.shutdown(wait=True)


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """(In a worker, as it starts) the worker ended by SIGKILL when the process that made it
    ends (Linux's PR_SET_PDEATHSIG), however that ends: a SIGKILLed analysis's workers
    otherwise wait for work forever, holding their memory and its scratch folder's lock
    (scratch.py). Where that is not to be had (not Linux), nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took hold
        os.kill(os.getpid(), signal.SIGKILL)


def planned(
    files: Sequence[tuple[int, Path]],
    count: int,
    chunk_files: int,
    progress: str | None,
    sizes: list[int] | None = None,
) -> tuple[list[list[tuple[int, Path]]], Callable[[int], None]]:
    """`files` in chunks for `count` processes (`chunk_bounds`), and what to call with a
    chunk's index when it is done: the line of progress (`map_chunks`)."""
    sizes = file_sizes(files) if sizes is None else sizes
    bounds = chunk_bounds(len(files), count, chunk_files)
    line = Progress(progress, len(files), sum(sizes)) if progress is not None else None

    def chunk_done(index: int) -> None:
        if line is not None:
            start, end = bounds[index]
            line.advance(end - start, sum(sizes[start:end]))

    return [list(files[a:b]) for a, b in bounds], chunk_done


def _here(
    parse: Callable[[list[tuple[int, Path]]], Result],
    chunks: list[list[tuple[int, Path]]],
    chunk_done: Callable[[int], None],
) -> list[Result]:
    """Every chunk parsed in this process, in order."""
    results = []
    for index, chunk in enumerate(chunks):
        results.append(_collector_paused(parse, chunk))
        chunk_done(index)
    return results


def _collector_paused(
    parse: Callable[[list[tuple[int, Path]]], Result], chunk: list[tuple[int, Path]]
) -> Result:
    """`parse(chunk)` with the cycle collector off: what a parse allocates (arrays, lists and
    dicts of records) forms no cycles, and the collections its allocations set off took
    about 3% of a rank-file worker's time. Back on after it, where it was on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return parse(chunk)
    finally:
        if enabled:
            gc.enable()


def _in_worker(
    parse: Callable[[list[tuple[int, Path]]], Result], chunk: list[tuple[int, Path]]
) -> Result:
    """`parse(chunk)` in a worker process, which then gives what the parse freed back to the
    system: an idle worker otherwise keeps its largest parse's peak resident (the C
    allocator holds freed memory for reuse), which a memory budget does not count."""
    try:
        return _collector_paused(parse, chunk)
    finally:
        _release_freed()


def _release_freed() -> None:
    """The cycles the parse left collected and the allocator's free memory returned to the
    system (glibc's malloc_trim; nothing where there is none)."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return


def chunk_bounds(items: int, count: int, most: int) -> list[tuple[int, int]]:
    """Consecutive (start, end) chunks of `items` for `count` processes, largest first: each
    a share of what is left (CHUNKS_PER_WORKER shares a process, at most `most` items), so
    the last chunks are small and no process idles long while another finishes a large one."""
    bounds = []
    start = 0
    least = max(1, most // 16)  # a round trip's worth
    while start < items:
        share = (items - start) // (max(count, 1) * CHUNKS_PER_WORKER)
        size = max(least, min(most, share))
        bounds.append((start, min(items, start + size)))
        start += size
    return bounds


def total_bytes(files: Sequence[tuple[int, Path]]) -> int:
    return sum(file_sizes(files))


def file_sizes(files: Sequence[tuple[int, Path]]) -> list[int]:
    """Each file's size in bytes (0 for one that cannot be read: its parse will say why)."""
    sizes = []
    for _, path in files:
        try:
            sizes.append(path.stat().st_size)
        except OSError:
            sizes.append(0)
    return sizes
