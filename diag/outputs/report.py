"""The report: a JSON-safe dict (contract `diag.report/1`, docs/cli.md) and its renderings.

`build_report` assembles the dict; `render_text`, `render_markdown` and `render_html` turn it into
something a person reads. The three renderers share one list of sections (title, header, rows of
strings), so they always show the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.metrics import MEMORY_FIELDS, RunMetrics, pipeline
from diag.outputs.escape import markdown, markdown_code, terminal_lines
from diag.outputs.failure_report import (
    STOPPED_HEADER,
    failure_fields,
    stopped_rows,
    stopped_title,
)
from diag.outputs.report_lines import (
    cache_notes,
    finding_head,
    headline,
    input_notes,
    ms,
    range_reason,
)
from diag.outputs.sparkline import rank_steps_line
from diag.outputs.units import aligned, mib, num, pct, pct_range, size
from diag.read.load import RunData
from diag.rules.engine import Diagnosis, Finding

if TYPE_CHECKING:
    from diag.outputs.html_charts import Chart

RUN_FIELDS = (
    "run_id", "trainer", "world_size", "backend", "device_type", "layout", "model", "status",
    "steps_completed", "injections", "groups",
)  # fmt: skip
TEXT_MAX_ROWS = 32
"""Per-rank tables longer than this are cut in the text rendering (JSON keeps every row)."""


AXES = ("dp", "tp", "pp", "ep", "cp")
SCHEDULE = ("microbatches", "virtual_stages")


def reported_layout(manifest: schema.Manifest, layout: Any) -> Any:
    """The layout as the report states it: what diag could not read is null, never the
    placeholder the analysis carries (the axes of a layout read as unknown; the micro-batches
    and virtual stages of a pipeline whose schedule the traces do not say; the ZeRO stage
    and the gradient accumulation where they do not say them)."""
    if not isinstance(layout, dict):
        return layout
    unknown = set(AXES) if manifest.layout_unknown else set()
    if not manifest.schedule_known and (manifest.layout_unknown or manifest.layout.pp > 1):
        unknown |= set(SCHEDULE)
    if not manifest.zero_known:
        unknown.add("zero_stage")
    if not manifest.accumulation_known:
        unknown.add("grad_accum")
    return {k: (None if k in unknown else v) for k, v in layout.items()}


def build_report(
    run: RunData, metrics: RunMetrics, diagnosis: Diagnosis | None = None
) -> dict[str, Any]:
    """The report dict: the `diag.report/1` fields (docs/cli.md, "Reports") plus `skipped` (notes on
    partial input) and, in each `memory` row, the rank's peak: `peak_bytes` at `peak_step`
    (docs/metrics.md); the findings and the rules' notes are `diagnosis`'s (none without one)."""
    findings, notes = (diagnosis.findings, diagnosis.notes) if diagnosis else ([], [])
    manifest = run.manifest.to_dict()
    report = {
        "schema": schema.REPORT_SCHEMA,
        "run": {name: manifest.get(name) for name in RUN_FIELDS}
        | {"layout": reported_layout(run.manifest, manifest.get("layout"))}
        # where a trace folder's layout came from (a run directory's is its manifest's)
        | ({"layout_source": source} if (source := manifest.get("layout_source")) else {}),
        # the step time over steps as one line of text, so a trend can be checked by eye
        "summary": {**metrics.summary, "step_time_line": _step_time_line(metrics)},
        "ranks": metrics.ranks.to_dict("records"),
        "collectives": metrics.collectives.to_dict("records"),
        "memory": memory_rows(metrics),
        "experts": metrics.experts.to_dict("records"),
        **({"device": metrics.device.to_dict("records")} if not metrics.device.empty else {}),
        **({"attribution": metrics.attribution.to_dict()} if metrics.attribution else {}),
        "findings": [finding_dict(f) for f in findings],
        # why a cache entry beside the data was not used: this read's, apart from the input's
        **({"cache_notes": list(run.cache_notes)} if run.cache_notes else {}),
        "skipped": [*run.skipped, *metrics.skipped, *notes],
        **failure_fields(metrics),  # a run that did not finish: where each rank stopped
    }
    return json_safe(report)


def finding_dict(finding: Finding | dict[str, Any]) -> dict[str, Any]:
    """A finding as the report writes it: its fields, `cost_range_s` only where the cost is a
    range (the reports of every other run as they were)."""
    out = dict(finding) if isinstance(finding, dict) else dataclasses.asdict(finding)
    if out.get("cost_range_s") is None:
        out.pop("cost_range_s", None)
    return out


def _step_time_line(metrics: RunMetrics) -> str | None:
    """The sparkline of the step time over steps; None for fewer than 3 steps (no shape)."""
    if (metrics.summary.get("steps_analysed") or 0) < MIN_STEPS_FOR_A_LINE:
        return None
    return rank_steps_line(metrics.rank_steps)


MIN_STEPS_FOR_A_LINE = 3


def memory_rows(metrics: RunMetrics) -> list[dict[str, Any]]:
    """The report's `memory` rows: per rank the maximum over steps of each memory field, and the
    rank's peak (`RunMetrics.memory_peak`): `peak_bytes`, the six categories at `peak_step`."""
    if metrics.memory.empty:
        return []
    peak = metrics.memory_peak.rename(columns={"step": "peak_step"})
    table = metrics.memory.merge(peak[["rank", "peak_step", "peak_bytes"]], on="rank", how="left")
    table["peak_step"] = table["peak_step"].astype("Int64")
    return list(table.to_dict("records"))


def json_safe(value: Any) -> Any:
    """Plain JSON types: numpy scalars -> Python, NaN/inf/NA -> None, dataclasses -> dicts."""
    kind = type(value)  # the plain types first, by identity: a report holds ~55k values
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        return {str(k): json_safe(v) for k, v in value.items()}
    if kind is list:
        return [json_safe(v) for v in value]
    return _json_safe_other(value)


def _json_safe_other(value: Any) -> Any:
    """`json_safe` of anything but the plain types (subclasses of them included)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [json_safe(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if pd.isna(value):
        return None
    return str(value)


# --- Shared content -----------------------------------------------------------------------------


@dataclass
class Section:
    title: str
    header: list[str]
    rows: list[list[str]]


def attribution_section(report: dict[str, Any]) -> Section:
    """Where the step goes: the ideal step, each cause's cost (largest first), the overlap of
    causes (what removing them one by one counts twice), the measured step."""
    attribution = report.get("attribution")
    if not attribution:
        return Section("", [], [])
    measured, ideal = attribution["replayed_step_s"], attribution["ideal_step_s"]
    causes = [c for c in attribution["causes"] if c["cost_s"] > 0 or _range_of(c)]
    overlap = measured - ideal - sum(c["cost_s"] for c in causes)
    rows = [["ideal step (every imbalance and transfer removed)", ms(ideal), pct(ideal / measured)]]
    for c in causes:
        low_high = _range_of(c)
        if low_high is None:
            rows.append([f"+ {c['label']}", ms(c["cost_s"]), pct(c["cost_share"])])
            continue
        # a range: the ambiguous gaps read as each rank's own time, and as waiting
        low, high = low_high
        rows.append([f"+ {c['label']} (a range: gaps that may be waiting)",
                     f"{low * 1e3:.1f}-{high * 1e3:.1f} ms",
                     pct_range(low / measured, high / measured)])  # fmt: skip
    if abs(overlap) >= 0.0005 * measured:  # a remainder that rounds to nothing is not shown
        rows.append(["- overlap of the causes above" if overlap < 0 else "+ not attributed",
                     ms(abs(overlap)), pct(abs(overlap) / measured)])  # fmt: skip
    measured_s = attribution.get("measured_step_s")
    rows.append([f"= mean step, replayed (measured {ms(measured_s)})", ms(measured), pct(1.0)])
    title = (
        f"where the step goes (what-if replay of {attribution['steps_replayed']} steps, "
        f"replay error {pct(attribution['replay_error'])})"
    )
    return Section(title, ["", "per step", "share"], rows)


def _range_of(cause: dict[str, Any]) -> tuple[float, float] | None:
    """A cause's cost range where its two readings differ (to a tenth of a millisecond)."""
    low_high = cause.get("cost_range_s")
    if not isinstance(low_high, list) or len(low_high) != 2:
        return None
    low, high = float(low_high[0]), float(low_high[1])
    return (low, high) if high - low >= 5e-5 else None


def finding_lines(report: dict[str, Any]) -> list[str]:
    """Per finding for the terminal: the head, `      why: ...` where the cost is explained
    (a rank's excess against what of it reaches the step's end), `      advice: ...` where
    there is some (the report JSON's `advice`)."""
    lines = []
    for finding in report["findings"]:
        lines.append(finding_head(finding))
        explained = (finding.get("evidence") or {}).get("cost_explained")
        if isinstance(explained, str):
            lines.append(f"      why: {explained}")
        if reason := range_reason(finding):
            lines.append(f"      range: {reason}")
        if finding.get("advice"):
            lines.append(f"      advice: {finding['advice']}")
    return lines


def _ranks_to_show(report: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The rank rows in rank order, or, when there are more than a terminal shows, the ranks
    the findings blame first and then the others by busy share (the straggler's end first),
    with a note on the order for the table's title."""
    rows = list(report["ranks"])
    if len(rows) <= TEXT_MAX_ROWS:
        return rows, ""
    blamed: list[int] = []
    for finding in report["findings"]:
        blamed += [r for r in finding.get("ranks") or [] if r not in blamed]
    first = {rank: i for i, rank in enumerate(blamed)}
    rows.sort(key=lambda r: (first.get(r["rank"], len(first)), -(r["busy_frac"] or 0.0), r["rank"]))
    return rows, "; blamed ranks first, then by busy share"


def sections(report: dict[str, Any]) -> list[Section]:
    """The tables every rendering shows, values already formatted."""
    rank_rows, order = _ranks_to_show(report)
    ranks = Section(
        f"ranks (each rank's own step, from its start to its end, and shares of it{order})",
        ["rank", "host", "steps", "mean step s", "busy", "comm", "exposed", "idle", "skew",
         "transfer"],
        [
            [str(r["rank"]), str(r["host"] or "n/a"), str(r["steps"]), num(r["step_time_s"]),
             pct(r["busy_frac"]), pct(r["comm_share"]), pct(r["exposed_comm_share"]),
             pct(r["idle_frac"]), _share(r.get("skew_s"), r["step_time_s"]),
             _share(r.get("transfer_s"), r["step_time_s"])]
            for r in rank_rows
        ],
    )  # fmt: skip
    collectives = Section(
        "collectives (per rank, over the analysed steps)",
        ["op", "group", "tag", "count", "bytes", "expected", "ratio", "time s", "busbw GB/s"],
        [
            # None: the trace does not say (a kernel named after no op; no group recorded)
            [str(c["op"] or "n/a"), str(c["group"] or "n/a"), str(c["tag"] or "-"),
             num(c["count"]),
             size(c["bytes"]), size(c["expected_bytes"]), num(c["ratio"]),
             num(c["time_s"]), num(c["busbw_GBps"])]
            for c in report["collectives"]
        ],
    )  # fmt: skip
    memory = Section(
        "memory (MiB, maximum over steps; peak: the six categories at the rank's peak step)",
        ["rank", *MEMORY_FIELDS, "peak", "peak step"],
        [
            [str(m["rank"]), *(mib(m[name]) for name in MEMORY_FIELDS), mib(m.get("peak_bytes")),
             num(m.get("peak_step"))]
            for m in report["memory"]
        ],
    )  # fmt: skip
    experts = Section(
        "experts (over the analysed steps and ranks)",
        ["layer", "experts", "load cv", "max/mean", "drop rate", "dead", "max/mean first->last",
         "drops first->last"],
        [
            [str(e["layer"]), str(e["experts"]), num(e["load_cv"]), num(e["max_over_mean"]),
             pct(e["drop_rate"]), str(e["dead_experts"]),
             f"{num(e.get('max_over_mean_first'))}->{num(e.get('max_over_mean_last'))}",
             f"{pct(e.get('drop_rate_first'))}->{pct(e.get('drop_rate_last'))}"]
            for e in report["experts"]
        ],
    )  # fmt: skip
    tensor_parallel = Section(
        "tensor parallel collectives per rank and step, against the ledger",
        ["op", "direction", "count", "ledger count", "bytes", "ledger bytes", "ratio"],
        [
            [str(t["op"]), str(t["direction"]), num(t["count_per_step"]),
             num(t["ledger_count_per_step"]), size(t["bytes_per_step"]),
             size(t["ledger_bytes_per_step"]), num(t["ratio"])]
            for t in report["summary"].get("tp_vs_ledger") or []
        ],
    )  # fmt: skip
    stages = _stage_section(report)
    window = _window_section(report)
    stopped = Section(stopped_title(report), STOPPED_HEADER, stopped_rows(report))
    tables = (stopped, attribution_section(report), ranks, stages, collectives, tensor_parallel,
              device_section(report), memory, experts, window)  # fmt: skip
    return [s for s in (*tables, *hta_sections(report)) if s.rows]


def _share(part_s: float | None, step_s: float | None) -> str:
    """A per-step time as a share of the step, or n/a."""
    return pct(part_s / step_s) if part_s is not None and step_s else "n/a"


def device_section(report: dict[str, Any]) -> Section:
    """Profiler traces: each rank's device time in HTA's terms, diag's kernel classes."""
    return Section(
        "device time per rank (HTA's definitions; diag's kernel classes)",
        ["rank", "kernel time s", "idle", "compute", "non-compute", "comm s", "comm under compute",
         "idle: host/kernel/other wait", "waiting for the host", "waiting, work queued"],
        [
            [str(d["rank"]), num(d["kernel_time_s"]), pct(d["idle_share"]),
             pct(d["compute_share"]), pct(d["non_compute_share"]), num(d["comm_s"]),
             pct(d["comm_overlap"]), _idle_split(d), pct(d.get("device_host_wait_share")),
             pct(d.get("device_queued_wait_share"))]
            for d in report.get("device") or []
        ],
    )  # fmt: skip


def _idle_split(device: dict[str, Any]) -> str:
    """HTA's split of the idle time (summed over streams) as `99/1/0%`; n/a without it."""
    found = [device.get(k) for k in ("host_wait_share", "kernel_wait_share", "other_idle_share")]
    shares = [float(s) for s in found if s is not None and s == s]  # NaN: no idle time
    return "/".join(f"{100 * s:.0f}" for s in shares) + "%" if len(shares) == 3 else "n/a"


_HTA_SHARES = ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg")


def hta_sections(report: dict[str, Any]) -> list[Section]:
    """HTA's own view of the traces (`--hta`): temporal breakdown with its overlap, the
    critical path's bottlenecks, then its notes and the analyses it could not run."""
    hta = report.get("hta")
    if not hta:
        return []
    overlap = {
        o.get("rank"): o.get("comp_comm_overlap_pctg") for o in hta.get("comm_comp_overlap") or []
    }
    temporal = Section(
        "HTA temporal breakdown (% of each rank's kernel time)",
        ["rank", "idle", "compute", "non-compute", "kernel time s", "comm under compute"],
        [
            [str(t["rank"]), *(f"{num(t.get(k))}%" for k in _HTA_SHARES),
             num((t.get("kernel_time(us)") or 0) / 1e6), f"{num(overlap.get(t['rank']))}%"]
            for t in hta.get("temporal_breakdown") or []
        ],
    )  # fmt: skip
    path = hta.get("critical_path") or {}
    critical = Section(
        f"HTA critical path (rank {path.get('rank')}, step {path.get('step')}): share bound by",
        ["bound by", "share"],
        [[str(k), f"{num(v)}%"] for k, v in (path.get("share") or {}).items()],
    )
    notes = Section(
        "HTA notes",
        ["note"],
        [[n] for n in hta.get("notes") or []]
        + [[f"{name} not available: {why}"] for name, why in (hta.get("errors") or {}).items()],
    )
    return [temporal, critical, notes]


def _window_section(report: dict[str, Any]) -> Section:
    """The profiler window the run captured (RUN/traces/), seen from the profiler's side."""
    traces = report.get("traces") or {}
    if "error" in traces:
        return Section("profiler window", ["error"], [[str(traces["error"])]])
    return Section(
        f"profiler window ({traces.get('path')}): share of each rank's step in the trace",
        ["rank", "steps", "mean step s", "busy", "comm", "exposed", "idle"],
        [
            [str(r["rank"]), str(r["steps"]), num(r["step_time_s"]), pct(r["busy_frac"]),
             pct(r["comm_share"]), pct(r["exposed_comm_share"]), pct(r["idle_frac"])]
            for r in traces.get("ranks") or []
        ],
    )  # fmt: skip


def _stage_section(report: dict[str, Any]) -> Section:
    """Pipeline stages (rows only for a pipeline run): compute per step and measured bubble."""
    ranks = pd.DataFrame(report["ranks"])
    theory = pct(report["summary"].get("bubble_theory"))
    return Section(
        "pipeline stages (bubble = share of the step without compute)",
        ["stage", "ranks", "compute s/step", "bubble", "theory"],
        [
            [str(s["stage"]), str(s["ranks"]), num(s["busy_per_step_s"]),
             pct(s["bubble_frac"]), theory]
            for s in pipeline.stage_table(ranks).to_dict("records")
        ] if not ranks.empty else [],
    )  # fmt: skip


# --- Renderers ----------------------------------------------------------------------------------


def render_text(report: dict[str, Any]) -> str:
    """Plain text for a terminal: headline, what of the input was not analysed, findings,
    tables, then the cache notes that matter. Every line is escaped for a terminal (names are
    the input's: diag/outputs/escape.py)."""
    lines = [headline(report)]
    if report.get("summary", {}).get("step_time_line"):
        lines.append(report["summary"]["step_time_line"])
    if notes := input_notes(report):
        lines += ["input problems:", *(f"  - {note}" for note in notes)]
    lines += finding_lines(report)
    for section in sections(report):
        rows = section.rows
        if len(rows) > TEXT_MAX_ROWS:
            cut = len(rows) - TEXT_MAX_ROWS
            rows = [*rows[:TEXT_MAX_ROWS], [f"... {cut} more rows (see --format json)"]]
        lines += ["", section.title, *aligned([section.header, *rows])]
    if report.get("summary", {}).get("host_checked") is False:
        lines += [
            "",
            "host: not checked (the records carry no CPU time: a profiler trace, or "
            "a run recorded before diag measured it), so waiting for a core reads as work",
        ]
    if cached := cache_notes(report):
        lines += ["", "cache:", *(f"  - {note}" for note in cached)]
    return terminal_lines(lines) + "\n"


def render_markdown(report: dict[str, Any]) -> str:
    """GitHub-flavoured Markdown (for CI summaries and pull requests)."""
    lines = [f"# diag report: {_md(report['run'].get('run_id') or '')}", "",
             markdown_code(headline(report))]  # fmt: skip
    if notes := input_notes(report):
        lines += ["", "Input problems:", "", *(f"- {_md(note)}" for note in notes)]
    if report["findings"]:
        lines += ["", "## Findings", ""]
        for finding in report["findings"]:
            lines.append(f"- {_md(finding_head(finding))}")
            if reason := range_reason(finding):
                lines.append(f"  - range: {_md(reason)}")
            if finding.get("advice"):
                lines.append(f"  - advice: {_md(finding['advice'])}")
    for section in sections(report):
        lines += ["", f"## {_md(section.title)}", ""]
        lines.append("| " + " | ".join(_md(h) for h in section.header) + " |")
        lines.append("|" + "---|" * len(section.header))
        lines += ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in section.rows]
    if cached := cache_notes(report):
        lines += ["", "## Cache", "", *(f"- {_md(note)}" for note in cached)]
    return "\n".join(lines) + "\n"


def _md(text: object) -> str:
    return markdown(text)


def render_html(
    report: dict[str, Any], charts: Sequence[Chart] = (), plotly_js_gzip: bytes | None = None
) -> str:
    """One self-contained HTML page (diag/outputs/html_page.py: status, the findings as cards,
    the run's facts, charts, tables, notes); every string is escaped. Without charts: inline CSS
    and no script. With `charts` (the dashboard's figures, `dashboard/html_report.py`) and
    plotly.js (gzip-compressed), the charts follow the facts and plotly.js is inlined once
    (diag/outputs/html_charts.py); it opens offline."""
    from diag.outputs import html_page  # the HTML format only: not imported for the others

    return html_page.page(report, sections(report), charts, plotly_js_gzip)
