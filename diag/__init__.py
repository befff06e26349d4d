"""diag: the analysis core (loading, metrics, ledger, rules, reports) and the `diag` CLI.

The public API, for the dashboard, the benchmarks and users' own scripts:

    import diag
    report = diag.analyze_path("runs/pp-m2")           # a path in, the diag.report/1 dict out
    run = diag.load_any("runs/pp-m2")                  # or step by step: the tables (RunData),
    metrics, report = diag.diagnose(run)               # then metrics + findings and the report

Analysis entry points
    `analyze_path(path, config, hta, layout, steps)` -> report dict (cached beside large runs);
    `load_any(path, layout, steps)` -> `RunData` (a run directory or a Kineto trace folder);
    `compute_metrics(run)` -> `RunMetrics` (no rules); `diagnose(run, config, hta)` ->
    (`RunMetrics`, report dict: the rules' findings are the report's `findings`). Unusable
    input raises `InputError`.
Types
    `RunData` (the loaded tables), `RunMetrics` (what the report is built from; its
    `memory_peak` is the one peak memory that the rules, `diag check` and the dashboard share),
    `InputError` (one line: "PATH: reason").
Growing runs
    `RunTail(folder, window_steps)`: a run directory read while it grows (`poll`, only the
    bytes appended since the last read; `window` of the last finished steps), for `diag watch`
    and the live dashboard. `LiveRun(folder, window_steps)`: a growing run analysed
    incrementally (`update(manifest)` takes in the newly finished steps once, `run()` is the
    RunData of them all, or of the last `window_steps`, from the kept per-step tables;
    `derived()` what the rules would derive from them, kept as the steps came); what `diag
    watch` and the live dashboard diagnose (`diagnose(live.run(), derived=live.derived())`).
The report contract
    `REPORT_SCHEMA` ("diag.report/1", the report's `schema` field).
Reading a report as diag shows it
    `PATTERN_NAMES` (collapse pattern -> display name), `rank_list(ranks)` ("0-3,6"),
    `format_metric(name, value)` (a metric by its unit suffix: shares in %, bytes in MiB, ...),
    `device_section(report)` and `hta_sections(report)` (the profiler tables as `Section`s:
    title, header, rows of strings), `compare_reports(labelled_reports, tolerance)` (what
    `diag compare` computes), `stopped_rows(report)` and `STOPPED_HEADER` (the "where each
    rank stopped" table of a run that did not finish).
What the designed pages lead with (diag/outputs/verdict.py)
    `verdicts(report)` (each finding as a `Verdict`: severity, what, who, cost, fix, catalogue),
    `singled_out_ranks(report)` (the ranks a finding singles out: the blamed marks),
    `summary_items(report)` (the headline as labelled facts), `run_status`, `did_not_finish`,
    `failure_rows` (where each rank stopped), `attribution_words` (the what-if in a sentence).

Anything else in diag's modules is internal and may move. `diag.contract` (the run directory
format, shared with the collectors) may be imported directly for its constants.

Kept import-light: the collectors import `diag.contract.schema` inside training processes, which
runs this file, so the names above are imported on first use (PEP 562 `__getattr__`), not here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.api import analyze_path, diagnose, load_any
    from diag.contract.schema import REPORT_SCHEMA
    from diag.errors import InputError
    from diag.metrics import RunMetrics, compute_metrics
    from diag.metrics.live import LiveRun
    from diag.outputs.compare import compare_reports
    from diag.outputs.failure_report import STOPPED_HEADER, stopped_rows
    from diag.outputs.report import Section, device_section, hta_sections
    from diag.outputs.report_lines import PATTERN_NAMES
    from diag.outputs.units import format_metric, rank_list
    from diag.outputs.verdict import (
        Verdict,
        attribution_words,
        did_not_finish,
        failure_rows,
        run_status,
        singled_out_ranks,
        status_words,
        summary_items,
        verdicts,
    )
    from diag.read.growing import RunTail
    from diag.read.load import RunData

__version__ = "0.1.0"

_HOME = {
    "analyze_path": "diag.api",
    "load_any": "diag.api",
    "diagnose": "diag.api",
    "compute_metrics": "diag.metrics",
    "RunData": "diag.read.load",
    "RunMetrics": "diag.metrics",
    "InputError": "diag.errors",
    "REPORT_SCHEMA": "diag.contract.schema",
    "PATTERN_NAMES": "diag.outputs.report_lines",
    "Section": "diag.outputs.report",
    "rank_list": "diag.outputs.units",
    "device_section": "diag.outputs.report",
    "hta_sections": "diag.outputs.report",
    "format_metric": "diag.outputs.units",
    "compare_reports": "diag.outputs.compare",
    "RunTail": "diag.read.growing",
    "LiveRun": "diag.metrics.live",
    "STOPPED_HEADER": "diag.outputs.failure_report",
    "stopped_rows": "diag.outputs.failure_report",
    "Verdict": "diag.outputs.verdict",
    "attribution_words": "diag.outputs.verdict",
    "did_not_finish": "diag.outputs.verdict",
    "failure_rows": "diag.outputs.verdict",
    "run_status": "diag.outputs.verdict",
    "status_words": "diag.outputs.verdict",
    "singled_out_ranks": "diag.outputs.verdict",
    "summary_items": "diag.outputs.verdict",
    "verdicts": "diag.outputs.verdict",
}
"""Each public name and the module that defines it."""

__all__ = [
    "PATTERN_NAMES",
    "REPORT_SCHEMA",
    "STOPPED_HEADER",
    "InputError",
    "LiveRun",
    "RunData",
    "RunMetrics",
    "RunTail",
    "Section",
    "Verdict",
    "analyze_path",
    "attribution_words",
    "compare_reports",
    "compute_metrics",
    "device_section",
    "diagnose",
    "did_not_finish",
    "failure_rows",
    "format_metric",
    "hta_sections",
    "load_any",
    "rank_list",
    "run_status",
    "singled_out_ranks",
    "status_words",
    "stopped_rows",
    "summary_items",
    "verdicts",
]


if not TYPE_CHECKING:  # mypy sees the imports above, so a misspelt name is an error there

    def __getattr__(name: str) -> Any:
        """A public name, imported from its module on first use (and kept here after)."""
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module 'diag' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
