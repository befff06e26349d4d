"""`diag check`: the CI gate. Limits on one run's summary, and regressions against a baseline run.

Pure functions over `diag.report/1` dicts (`check_limits` here; `regressions`, `peak_memory_bytes`
in diag/outputs/compare.py); the click command at the bottom is the thin shell: exit 0 when every
limit holds, 1 with one line per violated limit or regressed metric, 2 with one line on unusable
input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from diag.api import analyze_path
from diag.cli.shell import fail, project_config, rule_thresholds
from diag.errors import InputError
from diag.outputs.compare import (
    BASELINE_METRICS,
    DEFAULT_TOLERANCE,
    metric_value,
    regressions,
)

EXIT_VIOLATED = 1

LIMITS = {
    "max_comm_share": "comm_share",
    "max_exposed_comm_share": "exposed_comm_share",
    "max_bubble": "bubble_fraction",
}
"""Check option (and `[check]` key in --config) -> the summary field it bounds from above."""


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


def unfinished(report: Mapping[str, Any]) -> str | None:
    """One line when the run did not complete (its status from its records: failed, hung,
    running, undecidable; docs/cli.md): a check fails on it whatever its limits."""
    summary = report.get("summary") or {}
    status = summary.get("status")
    if status in (None, "completed"):
        return None
    return f"run {status}, not completed: {summary.get('status_reason') or 'no reason given'}"


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
    """Gate CI on the run PATH: exit 1 with one line per violated limit or regressed metric,
    and on a run that did not complete (failed, hung, running, undecidable) whatever its limits.

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
        if (why := unfinished(report)) is not None:  # issue 40: a dead job never passes
            violations.insert(0, why)
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
