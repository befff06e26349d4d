"""One measurement of benchmarks/kineto_load.py, in a fresh process of its own: diag's cold
load and metrics of a trace folder, or HTA's `TraceAnalysis` (with its temporal breakdown for
a generated folder), timed, with each process's peak memory; the memory of every process
together sampled only where asked (`sample`: the sampling slows what it samples). Its result
is written as JSON for the parent (`child_main`)."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks.process_tree import KIB_PER_MIB, TreeRss
except ModuleNotFoundError:  # run as a script: benchmarks/ itself is on sys.path
    from process_tree import KIB_PER_MIB, TreeRss  # type: ignore[no-redef]


def _peak_mib() -> tuple[float, float]:
    """(own max RSS, largest max RSS of a finished child) in MiB; Linux reports KiB. Our own
    is the address space's high-water mark (VmHWM): `ru_maxrss` keeps, across the exec that
    started this process, the RSS its launcher had when it forked (this benchmark's, 179 MiB
    once it built the LARGE folder), so every later measurement read at least that."""
    own_kib = _high_water_kib() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return own_kib / KIB_PER_MIB, children_kib / KIB_PER_MIB


def _high_water_kib() -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _silence_hta() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("hta", "root", ""):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.disable(logging.WARNING)


def _child_ours(folder: Path, second_repeats: int, sample_tree: bool) -> dict[str, Any]:
    from diag import analyze_path, compute_metrics
    from diag.metrics.file_reduction import reduce_rank_files
    from diag.read.kineto import cache, load_trace_dir  # the loader itself, its cache off
    from diag.read.kineto.kernels import KernelPatterns
    from diag.read.kineto.trace_folder import trace_files

    tree = TreeRss()
    if sample_tree:
        tree.start()
    started = time.perf_counter()
    # as `diag analyze` loads it: a large folder reduced (kineto/window.py)
    run = load_trace_dir(folder, use_cache=False, breakdown=reduce_rank_files)
    loaded = time.perf_counter()
    compute_metrics(run)
    cold_s, cold_metrics_s = time.perf_counter() - started, time.perf_counter() - loaded
    tree_mib, tree_pss_mib = _tree_peaks(tree, sample_tree)
    own_mib, children_mib = _peak_mib()
    second_s: list[float] = []
    second_metrics_s: list[float] = []
    cache_hit = None
    if second_repeats:
        analyze_path(folder)  # the first analysis writes the caches (tables and report)
        key = cache.key(trace_files(folder), KernelPatterns(), None)
        cache_hit = cache.read(folder, key).value is not None
        for _ in range(second_repeats):
            started = time.perf_counter()
            analyze_path(folder)  # the whole analysis again: served from the report cache
            second_s.append(time.perf_counter() - started)
            second_metrics_s.append(0.0)
    return {"cold_s": cold_s, "cold_metrics_s": [cold_metrics_s], "own_mib": own_mib,
            "children_mib": children_mib, "tree_mib": tree_mib, "tree_pss_mib": tree_pss_mib,
            "second_s": second_s,
            "second_metrics_s": second_metrics_s, "cache_hit": cache_hit}  # fmt: skip


def _child_hta(
    folder: Path, second_repeats: int, sample_tree: bool, breakdown: bool = False
) -> dict[str, Any]:
    _silence_hta()
    from hta.trace_analysis import TraceAnalysis

    _silence_hta()  # again: importing HTA may configure its loggers
    tree = TreeRss()
    if sample_tree:
        tree.start()
    started = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=str(folder))
    if breakdown:  # what diag's metrics give at least: the time classes of every rank
        analysis.get_temporal_breakdown(visualize=False)
    cold_s = time.perf_counter() - started
    tree_mib, tree_pss_mib = _tree_peaks(tree, sample_tree)
    own_mib, children_mib = _peak_mib()
    second_s = []
    for _ in range(second_repeats):
        started = time.perf_counter()
        TraceAnalysis(trace_dir=str(folder))
        second_s.append(time.perf_counter() - started)
    return {"cold_s": cold_s, "own_mib": own_mib, "children_mib": children_mib,
            "tree_mib": tree_mib, "tree_pss_mib": tree_pss_mib, "second_s": second_s}  # fmt: skip


def _tree_peaks(tree: TreeRss, sampled: bool) -> tuple[float | None, float | None]:
    """The sampled peaks of every process together (MiB: summed RSS, summed PSS); None for a
    timed run, which samples nothing (the sampler's reads of /proc took 10-20% of a 1.5 s
    analysis on two cores)."""
    if not sampled:
        return None, None
    return tree.stop(), tree.peak_pss_kib / KIB_PER_MIB


def child_main(kind: str, folder: Path, second_repeats: int, out: Path, sample: bool) -> None:
    try:
        if kind == "ours":
            result = _child_ours(folder, second_repeats, sample)
        else:
            result = _child_hta(folder, second_repeats, sample, breakdown=kind == "hta-breakdown")
    except BaseException as error:  # HTA fails in many ways (asserts, KeyError, SystemExit)
        result = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                  if str(error) else type(error).__name__}  # fmt: skip
    out.write_text(json.dumps(result))
