"""The public entry point of the analysis core: a path in, the report (JSON contract) out."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diag import cache, schema
from diag.errors import InputError
from diag.load import RunData, load_run
from diag.metrics import RunMetrics, compute_metrics
from diag.report import build_report, json_safe
from diag.rules import run_rules

TRACES_DIR = "traces"
"""Where a run keeps its profiler window (collectors/profiler.py writes it)."""
CACHE_MIN_BYTES = 8 * 2**20
"""Run directories smaller than this are parsed again each time (well under a second)."""
RUN_CACHE_NAME = "run"
RUN_LOADER = "diag.load"
"""The module whose code (with every diag module it imports) shapes the cached tables."""


def analyze_path(
    path: str | Path,
    config: Mapping[str, Any] | None = None,
    hta: bool = False,
    layout: schema.Layout | None = None,
    steps: range | None = None,
) -> dict[str, Any]:
    """Load a run directory or a Kineto trace folder, compute its metrics, run the rules and
    build the `diag.report/1` report. `config` holds rule thresholds by rule code or name (a
    parsed TOML table); `hta` adds HTA's own analyses of the traces (slow: HTA parses again);
    `layout` says how a trace folder's ranks are laid out (a run directory has its manifest);
    `steps` analyses a window of a run directory's steps.

    Raises `diag.errors.InputError` (one line naming the file and the reason) on unusable input.
    """
    from diag.kineto import is_trace_dir

    folder = Path(path)
    if layout is not None and not is_trace_dir(folder):
        raise InputError(folder, "--layout is for profiler trace folders; a run has its manifest")
    if steps is not None and is_trace_dir(folder):
        raise InputError(folder, "--steps is for run directories; a trace holds its own window")
    key = None
    if is_trace_dir(folder) or _input_bytes(folder) >= CACHE_MIN_BYTES:
        key = cache.report_key(folder, (dict(config or {}), hta, layout, steps))
        found = cache.read_report(folder, key)
        if found.value is not None:
            return dict(found.value)
    run = load_any(path, layout, steps)
    if key is not None and found.note:
        run.cache_notes.append(found.note)
    _, report = diagnose(run, config, hta)
    if key is not None:
        kept = [note for note in report["skipped"] if note not in run.cache_notes]
        cache.write_report(folder, key, {**report, "skipped": kept})
    return report


def diagnose(
    run: RunData, config: Mapping[str, Any] | None = None, hta: bool = False
) -> tuple[RunMetrics, dict[str, Any]]:
    """A loaded run's metrics (findings included) and its report, profiler traces added."""
    metrics = compute_metrics(run)
    metrics.findings = run_rules(run, metrics, config)
    return metrics, with_traces(build_report(run, metrics), run, hta)


def with_traces(report: dict[str, Any], run: RunData, hta: bool = False) -> dict[str, Any]:
    """The report with what the run's profiler traces add: the `--profile-steps` window of a
    run directory (`traces`) and, on request, HTA's analyses of the trace folder (`hta`)."""
    traces = run.path if run.manifest.trainer == "kineto" else run.path / TRACES_DIR
    if run.manifest.trainer != "kineto" and traces.is_dir():
        report["traces"] = _profiler_window(traces)
    if hta and traces.is_dir():
        from diag.kineto.hta_bridge import hta_analyses

        report["hta"] = json_safe(hta_analyses(traces))
    return report


def _profiler_window(folder: Path) -> dict[str, Any]:
    """The Kineto window a run captured (`--profile-steps`), measured the same way, or the
    reason it could not be read."""
    from diag.kineto import load_trace_dir

    try:
        run = load_trace_dir(folder)
    except InputError as error:
        return {"path": str(folder), "error": str(error)}
    metrics = compute_metrics(run)
    return json_safe({
        "path": str(folder),
        "summary": metrics.summary,
        "ranks": metrics.ranks.to_dict("records"),
        "collectives": metrics.collectives.to_dict("records"),
        "skipped": [*run.skipped, *metrics.skipped],
    })  # fmt: skip


def load_any(
    path: str | Path, layout: schema.Layout | None = None, steps: range | None = None
) -> RunData:
    """A run directory (manifest.json; only `steps` when given) or a folder of PyTorch
    profiler (Kineto) traces; a large run's tables come from the cache beside it when its
    files have not changed."""
    from diag.kineto import is_trace_dir, load_trace_dir

    folder = Path(path)
    if is_trace_dir(folder):
        return load_trace_dir(folder, layout=layout)
    if _input_bytes(folder) < CACHE_MIN_BYTES:
        return load_run(folder, steps)
    key = cache.table_key(cache.file_stamps(_run_files(folder)), steps, RUN_LOADER)
    found = cache.read(folder, RUN_CACHE_NAME, key)
    if isinstance(found.value, RunData):
        return found.value
    run = load_run(folder, steps)
    cache.write(folder, RUN_CACHE_NAME, key, run)
    if found.note:
        run.cache_notes.append(found.note)
    return run


def _run_files(folder: Path) -> list[Path]:
    """The manifest and the rank files, sorted; empty if the folder cannot be listed."""
    try:
        return sorted(
            p
            for p in folder.iterdir()
            if p.name == schema.MANIFEST_FILE or schema.RANK_FILE_RE.match(p.name)
        )
    except OSError:
        return []


def _input_bytes(folder: Path) -> int:
    try:
        return sum(stamp[1] for stamp in cache.file_stamps(_run_files(folder)))
    except OSError:
        return 0
