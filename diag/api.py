"""The public entry point of the analysis core: a path in, the report (JSON contract) out."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diag.contract import schema
from diag.errors import InputError
from diag.metrics import MEMO_NAME, RunMetrics, compute_metrics, reduce_rank_files
from diag.outputs.report import build_report, json_safe
from diag.read import cache
from diag.read.load import RunData, with_cache_note
from diag.read.sources import LoadOptions, Source, find_source
from diag.read.sources.profiler_traces import ProfilerTraces
from diag.rules import run_rules


def analyze_path(
    path: str | Path,
    config: Mapping[str, Any] | None = None,
    hta: bool = False,
    layout: schema.Layout | None = None,
    steps: range | None = None,
    replay_all: bool = False,
) -> dict[str, Any]:
    """Load a run directory or a Kineto trace folder, compute its metrics, run the rules and
    build the `diag.report/1` report. `config` holds rule thresholds by rule code or name (a
    parsed TOML table); `hta` adds HTA's own analyses of the traces (slow: HTA parses again);
    `layout` says how a trace folder's ranks are laid out (a run directory has its manifest);
    `steps` analyses a window of a run directory's steps; `replay_all` attributes every
    analysed step (docs/scale.md, "Every step replayed"), not only a budget's.

    Raises `diag.errors.InputError` (one line naming the file and the reason) on unusable input.
    """
    folder = Path(path)
    source = find_source(folder)
    # a large trace folder keeps a window of records, and is not read again a chunk of steps at
    # a time as a run directory is (record_spill.py reads rank files): replaying every step
    # of one keeps every record
    whole = replay_all and isinstance(source, ProfilerTraces)
    options = LoadOptions(layout, steps, None if whole else reduce_rank_files)
    key, found = None, cache.Lookup()
    if source.cache_report(folder):
        options_key = (dict(config or {}), hta, layout, steps) + (("replay", "all"),) * replay_all
        key = cache.report_key(folder, options_key)
        found = cache.read_report(folder, key)
        if found.value is not None:
            return dict(found.value)
    run = with_cache_note(source.load(folder, options), found.note)
    _, report = _diagnosed(run, source, config, hta, replay_all)
    if key is not None:
        stored = {k: v for k, v in report.items() if k != "cache_notes"}  # this read's notes
        cache.write_report(folder, key, stored)
    return report


def diagnose(
    run: RunData,
    config: Mapping[str, Any] | None = None,
    hta: bool = False,
    replay_all: bool = False,
    derived: Mapping[str, Any] | None = None,
) -> tuple[RunMetrics, dict[str, Any]]:
    """A loaded run's metrics and its report (the rules' findings in it), profiler traces added.
    `derived`: what the rules would derive from the run, already known (`LiveRun.derived()`)."""
    return _diagnosed(run, find_source(run.path), config, hta, replay_all, derived)


def _diagnosed(
    run: RunData,
    source: Source,
    config: Mapping[str, Any] | None,
    hta: bool,
    replay_all: bool = False,
    derived: Mapping[str, Any] | None = None,
) -> tuple[RunMetrics, dict[str, Any]]:
    """`diagnose` with the run's source already known (found once, where the run was read)."""
    memo = (derived or {}).get(MEMO_NAME)  # a live run's replayed chunks
    metrics = compute_metrics(run, replay_all, memo)
    diagnosis = run_rules(run, metrics, config, derived)
    return metrics, with_traces(build_report(run, metrics, diagnosis), run, source, hta)


def with_traces(
    report: dict[str, Any], run: RunData, source: Source, hta: bool = False
) -> dict[str, Any]:
    """The report with what the run's profiler traces add: the `--profile-steps` window of a
    run directory (`traces`) and, on request, HTA's analyses of the trace folder (`hta`)."""
    window = source.profiler_window(run.path)
    if window is not None:
        report["traces"] = _profiler_window(window)
    traces = source.profiler_traces(run.path)
    if hta and traces is not None and traces.is_dir():
        from diag.read.kineto.hta_bridge import hta_analyses

        report["hta"] = json_safe(hta_analyses(traces))
    return report


def _profiler_window(folder: Path) -> dict[str, Any]:
    """The Kineto window a run captured (`--profile-steps`), measured the same way, or the
    reason it could not be read."""
    from diag.read.kineto import load_trace_dir

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
        "skipped": [*run.skipped, *run.cache_notes, *metrics.skipped],
    })  # fmt: skip


def load_any(
    path: str | Path, layout: schema.Layout | None = None, steps: range | None = None
) -> RunData:
    """A run directory (manifest.json; only `steps` when given) or a folder of PyTorch profiler
    (Kineto) traces, through the source of its format (`diag.read.sources`)."""
    folder = Path(path)
    return find_source(folder).load(folder, LoadOptions(layout, steps, reduce_rank_files))
