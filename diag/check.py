"""`diag check`: the CI gate. Limits on one run's summary, and regressions against a baseline run.

Pure functions over `diag.report/1` dicts (`check_limits`, `regressions`, `peak_memory_bytes`);
the click command at the bottom is the thin shell: exit 0 when every limit holds, 1 with one
line per violated limit or regressed metric, 2 with one line on unusable input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from diag.analysis import analyze_path
from diag.errors import InputError
from diag.shell import fail, project_config, rule_thresholds
from diag.units import num, pct, si, size

EXIT_VIOLATED = 1
DEFAULT_TOLERANCE = 0.1
"""Relative tolerance of a baseline comparison: slower by more than 10% is a regression."""

LIMITS = {
    "max_comm_share": "comm_share",
    "max_exposed_comm_share": "exposed_comm_share",
    "max_bubble": "bubble_fraction",
}
"""Check option (and `[check]` key in --config) -> the summary field it bounds from above."""


@dataclass(frozen=True)
class Metric:
    """A metric compared across runs: where it comes from and which way is worse."""

    name: str
    higher_is_worse: bool
    floor: float = 0.0  # relative changes are taken against max(before, floor)


BASELINE_METRICS = (Metric("step_time_s", True), Metric("tokens_per_s", False))
"""What `diag check --baseline` compares: the step time and the throughput."""
COMPARE_METRICS = (
    *BASELINE_METRICS,
    Metric("comm_share", True, floor=0.05),
    Metric("exposed_comm_share", True, floor=0.05),
    Metric("bubble_fraction", True, floor=0.05),
    Metric("peak_memory_bytes", True),
)
"""What `diag compare` lists for a before/after pair. Shares below 5% count as 5%, so that a
share moving from 1% to 2% is not called a 100% regression."""


@dataclass(frozen=True)
class Regression:
    metric: str
    before: float
    after: float
    change: float  # relative, signed: (after - before) / max(before, floor)
    tolerance: float

    def line(self, baseline_label: str = "baseline") -> str:
        return (
            f"regressed {self.metric}: {format_metric(self.metric, self.after)} "
            f"vs {baseline_label} {format_metric(self.metric, self.before)}"
            f" ({self.change:+.1%}, tolerance {self.tolerance:.0%})"
        )


def metric_value(report: Mapping[str, Any], name: str) -> float | None:
    """A summary field of the report, or `peak_memory_bytes` computed from its memory table."""
    if name == "peak_memory_bytes":
        return peak_memory_bytes(report)
    value = report["summary"].get(name)
    return None if value is None else float(value)


def peak_memory_bytes(report: Mapping[str, Any]) -> float | None:
    """The largest device peak over ranks, as the device measured it (`device_peak`, CUDA);
    without one, the largest `peak_bytes` (the six categories at a rank's peak step,
    `RunMetrics.memory_peak`: the peak the rules and the dashboard show)."""
    measured = [m["device_peak"] for m in report["memory"] if m.get("device_peak") is not None]
    if measured:
        return float(max(measured))
    peaks = [m["peak_bytes"] for m in report["memory"] if m.get("peak_bytes") is not None]
    return float(max(peaks)) if peaks and max(peaks) > 0 else None


def check_limits(
    report: Mapping[str, Any], limits: Mapping[str, float]
) -> tuple[list[str], list[str]]:
    """(violations, notes): one line per limit the run exceeds, and one per limit whose metric
    the run does not have (e.g. a bubble limit on a run without a pipeline), which passes."""
    violations, notes = [], []
    for option, limit in limits.items():
        field = LIMITS[option]
        value = metric_value(report, field)
        flag = "--" + option.replace("_", "-")
        if value is None:
            notes.append(f"{field} not measured in this run; {flag} not checked")
        elif value > limit:
            violations.append(f"{field} {value:.3f} > {limit:.3f} ({flag})")
    return violations, notes


def regressions(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    tolerance: float,
    metrics: tuple[Metric, ...] = BASELINE_METRICS,
) -> list[Regression]:
    """The metrics of `after` that are worse than `before` by more than `tolerance` (relative).
    A metric missing from either run is not compared."""
    found = []
    for metric in metrics:
        old, new = metric_value(before, metric.name), metric_value(after, metric.name)
        if old is None or new is None:
            continue
        scale = max(abs(old), metric.floor)
        if scale == 0:
            continue
        change = (new - old) / scale
        worse = change if metric.higher_is_worse else -change
        if worse > tolerance:
            found.append(Regression(metric.name, old, new, change, tolerance))
    return found


def format_metric(name: str, value: float | None) -> str:
    """A metric as a person reads it: shares in %, bytes in KiB/MiB/GiB, throughput as 1.4k."""
    if name.endswith("_share") or name.endswith("_fraction"):
        return pct(value)
    if name.endswith("_bytes"):
        return size(value)
    if name.endswith("_per_s"):
        return si(value)
    return num(value)


def _plan_violations(
    report: Mapping[str, Any], plan_path: str, tolerance: float | None
) -> list[str]:
    """`--plan FILE`: the run against the plan for its own layout (diag/plan/verdict.py)."""
    import json

    from diag.plan.verdict import DEFAULT_PLAN_TOLERANCE, check_against_plan

    tol = DEFAULT_PLAN_TOLERANCE if tolerance is None else tolerance
    if tol < 0:
        raise click.UsageError(f"--plan-tolerance must be >= 0, got {tol}")
    try:
        with open(plan_path, encoding="utf-8") as handle:
            plan = json.loads(handle.read(MAX_PLAN_BYTES + 1) or "null")
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nesting too deep
        raise InputError(plan_path, f"cannot read the plan ({str(err)[:200]})") from None
    if not isinstance(plan, dict) or plan.get("schema") != "diag.plan/1":
        raise InputError(plan_path, "not a diag.plan/1 document (diag plan --format json)")
    try:
        violations, problem = check_against_plan(report, plan, tol)
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(plan_path, f"malformed plan entry ({err})") from None
    if problem is not None:
        raise InputError(plan_path, problem)
    return violations


MAX_PLAN_BYTES = 16 * 2**20
"""A plan file larger than this is refused (a plan of every layout is a few MiB)."""


# --- The command --------------------------------------------------------------------------------


def _limits_from(
    config_check: Mapping[str, Any], path: str, **given: float | None
) -> dict[str, float]:
    """The limits to check: command-line options over the config's `[check]` table."""
    known = (*LIMITS, "tolerance")
    for key in config_check:
        if key not in known:
            raise InputError(path, f"[check] has no setting {key!r} (known: {', '.join(known)})")
    merged: dict[str, float] = {}
    for option in known:
        value = given.get(option)
        if value is None and option in config_check:
            value = config_check[option]
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InputError(path, f"[check] {option} must be a number, got {value!r}")
            merged[option] = float(value)
    return merged


@click.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--max-comm-share", type=float, help="Limit on the communication share of a step.")
@click.option("--max-exposed-comm-share", type=float, help="Limit on the exposed comm share.")
@click.option("--max-bubble", type=float, help="Limit on the measured pipeline bubble fraction.")
@click.option("--baseline", metavar="RUN", help="A baseline run to compare step time against.")
@click.option(
    "--tolerance",
    type=float,
    help=f"Relative slowdown allowed against --baseline [default: {DEFAULT_TOLERANCE}].",
)
@click.option("--config", metavar="FILE", help="TOML: [check] limits and [rules.CODE] thresholds.")
@click.option("--plan", "plan_path", metavar="FILE",
              help="A `diag plan --format json` file: fail when the run is slower than the plan "
              "for its layout by more than --plan-tolerance.")  # fmt: skip
@click.option("--plan-tolerance", type=float, default=None,
              help="Relative slowdown allowed against --plan [default: 0.25].")  # fmt: skip
def check(
    path: str,
    max_comm_share: float | None,
    max_exposed_comm_share: float | None,
    max_bubble: float | None,
    baseline: str | None,
    tolerance: float | None,
    config: str | None,
    plan_path: str | None = None,
    plan_tolerance: float | None = None,
) -> None:
    """Gate CI on the run PATH: exit 1 with one line per violated limit or regressed metric.

    Limits are upper bounds on fractions of the step (0.3 = 30%). With --baseline RUN, a step
    time or throughput worse than the baseline's by more than --tolerance is a regression.
    """
    try:
        thresholds, config_check = None, {}
        source, parsed = project_config(config)
        if source is not None:
            thresholds = rule_thresholds(source, parsed)
            config_check = parsed.get("check", {})
            if not isinstance(config_check, dict):
                raise InputError(source, "[check] must be a table of limits")
        settings = _limits_from(
            config_check,
            source or "",
            max_comm_share=max_comm_share,
            max_exposed_comm_share=max_exposed_comm_share,
            max_bubble=max_bubble,
            tolerance=tolerance,
        )
        tol = settings.pop("tolerance", DEFAULT_TOLERANCE)
        if tolerance is not None and baseline is None:
            raise click.UsageError("--tolerance needs --baseline RUN")
        if tol < 0:
            raise click.UsageError(f"--tolerance must be >= 0, got {tol}")
        report = analyze_path(path, thresholds)
        violations, notes = check_limits(report, settings)
        if baseline is not None:
            before = analyze_path(baseline, thresholds)
            violations += [r.line() for r in regressions(before, report, tol)]
        if plan_path is not None:
            violations += _plan_violations(report, plan_path, plan_tolerance)
    except InputError as error:
        fail(error)
    for note in notes:
        click.echo(f"diag check: note: {note}", err=True)
    for line in violations:
        click.echo(line)
    if violations:
        raise SystemExit(EXIT_VIOLATED)
    checked = len(settings) + (len(BASELINE_METRICS) if baseline else 0) + (1 if plan_path else 0)
    click.echo(f"ok: {path}: {checked} checks hold")
