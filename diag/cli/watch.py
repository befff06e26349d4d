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

Between analyses every poll also asks whether the job is alive (`diag.metrics.live.liveness`,
over each rank's records as they arrived): a rank whose progress stopped for 3 median steps
+ 5 s while the others' records or heartbeats go on, or whose stall event or exception
arrived, is named once (`silent rank R ...`) unless it waits in a collective; when every rank
closed with a failure or no rank wrote for long, the job died: watch says why and ends with
status `failed` (the command exits 1, docs/cli.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import click

from diag.api import analyze_path, diagnose
from diag.cli.shell import fail, project_config, rule_thresholds
from diag.contract import schema
from diag.errors import InputError
from diag.metrics.live import Liveness, LiveRun, liveness
from diag.outputs.report_lines import finding_head, status_line

GONE_AFTER = 2
"""Analyses in a row without a finding before it is reported gone."""
EXIT_JOB_FAILED = 1
"""`diag watch`'s exit status when the job failed or died (the manifest says failed, every
rank closed with a failure, or no rank wrote for long); 0 when it completed, 2 on bad input."""
FAILED = schema.RunStatus.FAILED.value


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
    named: set[tuple[int, str]] = set()
    started = clock()
    while True:
        manifest = live.manifest()
        if manifest is None:
            if clock() - started > wait_s:
                raise InputError(folder, f"no readable manifest.json after {wait_s:.0f} s")
            time.sleep(min(interval_s, 0.5))
            continue
        ended = manifest.status != schema.RunStatus.RUNNING.value
        # after reading the status: an ended run's files are complete
        last = live.update(manifest, clock())
        if last is not None:
            _, report = diagnose(live.run(), config, derived=live.derived())
            for line in log.update(report["findings"], last):
                print(line, file=stream, flush=True)
        alive = liveness(live.tail.activity, manifest.world_size, clock(), interval_s)
        for line in silence_lines(alive, named):
            print(line, file=stream, flush=True)
        if alive.dead is not None and not ended:
            print(f"diag watch: the job died ({alive.dead}) after step {live.last}",
                  file=stream, flush=True)  # fmt: skip
            for line in _verdict(Path(folder), config):
                print(line, file=stream, flush=True)
            return FAILED
        if ended:
            print(f"diag watch: run {manifest.status} after step {live.last}", file=stream,
                  flush=True)  # fmt: skip
            return str(manifest.status)
        time.sleep(interval_s)


def _verdict(folder: Path, config: dict[str, Any] | None) -> list[str]:
    """The dead job's status and its first failure finding, from the whole run directory
    (the unfinished step's records and what each rank left open included)."""
    try:
        report = analyze_path(folder, config)
    except InputError as error:
        return [f"diag watch: the run could not be analysed: {error}"]
    summary = report["summary"]
    lines = [f"diag watch: {status_line(summary)}"]
    lines += [
        finding_head(f) for f in report["findings"][:1] if str(f.get("rule")).startswith("FLR")
    ]
    return lines


def silence_lines(alive: Liveness, named: set[tuple[int, str]]) -> list[str]:
    """A line for each rank newly silent (`named`: those said already, per reason; a rank
    that moves again may be named again), with the collectives the others wait in."""
    lines = []
    current = {(s["rank"], s["reason"]) for s in alive.silent}
    named &= current  # an episode that ended may be named again when it recurs
    for silent in alive.silent:
        key = (silent["rank"], silent["reason"])
        if key in named:
            continue
        named.add(key)
        where = [f"step {silent['step']}" if silent.get("step") is not None else "",
                 f"{silent['span']} open" if silent.get("span") else "",
                 f"at {silent['stack_top']}" if silent.get("stack_top") else ""]  # fmt: skip
        idle = f" for {silent['for_s']:.1f} s" if silent.get("for_s") is not None else ""
        line = f"silent rank {silent['rank']}: {silent['reason']}{idle}"
        line += f" ({', '.join(w for w in where if w)})" if any(where) else ""
        waits = [f"{_ranks(r)} wait in #{seq} of {group}"
                 for (group, seq), r in sorted(alive.waiting.items())]  # fmt: skip
        lines.append(line + (f"; {'; '.join(waits)}" if waits else ""))
    return lines


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(str(r) for r in sorted(ranks))}"


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
    changes severity or goes, and when a rank falls silent, until the manifest says the run
    ended (exit 0) or the job failed or died (exit 1)."""
    try:
        source, settings = project_config(config)
        thresholds = rule_thresholds(source, settings) if source else None
        status = watch(path, thresholds, interval_s, window_steps, wait_s)
    except InputError as error:
        fail(error)
    if status == FAILED:
        raise SystemExit(EXIT_JOB_FAILED)
