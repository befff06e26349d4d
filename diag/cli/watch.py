"""`diag watch RUN`: the findings of a run while it trains, a line each time one appears, changes
severity or goes away, until the manifest says the run ended.

Every `interval_s` the rank files are read from where the last read stopped (only the bytes appended
since, diag/rankfile/tail.py: whole lines of a `.jsonl` file, whole record batches of an `.arrows`
one; what is still being written waits for the next read), each record checked as the loader checks
it (diag/contract/schema.py, diag/rankfile/record_checks.py: nothing is executed, no line over
MAX_LINE_BYTES is held, no nesting deeper than MAX_JSON_DEPTH is parsed, an Arrow batch is read with
the full reader's checks). Each step every rank has finished is taken in once (diag/metrics/live.py:
its records become its rows of the per-step tables, then are dropped), and the analysis reads the
kept tables of the last `window_steps` (the rules see what the job does now, not its average since
the start, so a straggler that appears midway is named within a few steps); older rows are dropped,
so the memory stays that of the window however long the job runs, and a step costs the same to take
in at step 10 as at step 10,000.

A finding is the same finding while its rule and blamed ranks are (`rule`, `ranks`); it is
reported gone only after two analyses without it, so one noisy window does not make it flap.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import click

from diag.api import diagnose
from diag.cli.shell import fail, project_config, rule_thresholds
from diag.contract import schema
from diag.errors import InputError
from diag.metrics.live import LiveRun
from diag.outputs.escape import terminal
from diag.outputs.report_lines import finding_head

GONE_AFTER = 2
"""Analyses in a row without a finding before it is reported gone."""


Key = tuple[str, tuple[int, ...]]


@dataclass
class FindingLog:
    """The findings seen so far, and the lines that say what changed."""

    current: dict[Key, dict[str, Any]] = field(default_factory=dict)
    missing: dict[Key, int] = field(default_factory=dict)  # analyses in a row without it

    def update(self, findings: list[dict[str, Any]], step: int) -> list[str]:
        lines = []
        seen = set()
        for finding in findings:
            key = (str(finding.get("rule")), tuple(sorted(finding.get("ranks") or [])))
            seen.add(key)
            self.missing.pop(key, None)
            before = self.current.get(key)
            if before is None:
                lines.append(f"step {step}  new   {finding_head(finding)}")
            elif before.get("severity") != finding.get("severity"):
                lines.append(f"step {step}  now   {finding_head(finding)}")
            self.current[key] = finding
        for key in list(self.current):
            if key in seen:
                continue
            self.missing[key] = self.missing.get(key, 0) + 1
            if self.missing[key] >= GONE_AFTER:
                gone = self.current.pop(key)
                self.missing.pop(key)
                lines.append(f"step {step}  gone  {gone.get('rule')} {gone.get('title')}")
        return lines


def watch(
    folder: str | Path,
    config: dict[str, Any] | None = None,
    interval_s: float = 2.0,
    window_steps: int = 8,
    wait_s: float = 60.0,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Follow the run in `folder` until its manifest's status is no longer `running`, writing a
    line to `out` for every finding that appears, changes severity or goes; returns the final
    status. InputError when no manifest appears within `wait_s`."""
    stream = out or sys.stdout
    live = LiveRun(Path(folder), window_steps)
    log = FindingLog()
    started = clock()
    while True:
        manifest = live.manifest()
        if manifest is None:
            if clock() - started > wait_s:
                raise InputError(folder, f"no readable manifest.json after {wait_s:.0f} s")
            time.sleep(min(interval_s, 0.5))
            continue
        ended = manifest.status != schema.RunStatus.RUNNING.value
        last = live.update(manifest)  # after reading the status: an ended run's files are complete
        if last is not None:
            _, report = diagnose(live.run(), config, derived=live.derived())
            for line in log.update(report["findings"], last):
                print(terminal(line), file=stream, flush=True)
        if ended:
            print(f"diag watch: run {manifest.status} after step {live.last}", file=stream,
                  flush=True)  # fmt: skip
            return str(manifest.status)
        time.sleep(interval_s)


@click.command("watch")
@click.argument("path", type=click.Path(path_type=str))
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between reads of the growing run.",
)
@click.option(
    "--window",
    "window_steps",
    type=click.IntRange(min=2),
    default=8,
    show_default=True,
    help="The last finished steps each analysis reads.",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the run's manifest to appear.",
)
@click.option("--config", metavar="FILE", help="TOML file of rule thresholds.")
def watch_command(
    path: str, interval_s: float, window_steps: int, wait_s: float, config: str | None
) -> None:
    """Follow the run directory PATH while the job runs: a line each time a finding appears,
    changes severity or goes, until the manifest says the run ended."""
    try:
        source, settings = project_config(config)
        thresholds = rule_thresholds(source, settings) if source else None
        watch(path, thresholds, interval_s, window_steps, wait_s)
    except InputError as error:
        fail(error)
