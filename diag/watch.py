"""`diag watch RUN`: the findings of a run while it trains, a line each time one appears, changes
severity or goes away, until the manifest says the run ended.

Every `interval_s` the rank files are read from where the last read stopped (only the bytes
appended since, diag/tail.py: whole lines of a `.jsonl` file, whole record batches of an
`.arrows` one; what is still being written waits for the next read), each record checked as
the loader checks it (diag/schema.py, diag/record_checks.py: nothing is executed, no line over
MAX_LINE_BYTES is held, no nesting deeper than MAX_JSON_DEPTH is parsed, an Arrow batch is
read with the full reader's checks). The steps every rank has finished are analysed as a
window of the last `window_steps` (the rules see what the job does now, not its average since
the start, so a straggler that appears midway is named within a few steps), and older records
are dropped, so the memory stays that of the window however long the job runs.

A finding is the same finding while its rule and blamed ranks are (`rule`, `ranks`); it is
reported gone only after two analyses without it, so one noisy window does not make it flap.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import click

from diag import schema
from diag.analysis import diagnose
from diag.errors import InputError
from diag.load import RunData, run_from_records
from diag.record_checks import check_values
from diag.report_lines import finding_head
from diag.schema import RecordKind
from diag.shell import fail, project_config, rule_thresholds
from diag.tail import FileTail, open_tail

KINDS = frozenset(k.value for k in RecordKind)
GONE_AFTER = 2
"""Analyses in a row without a finding before it is reported gone."""


@dataclass
class RunTail:
    """A growing run directory, read a poll at a time; the records of unfinished steps and of
    the last `window_steps` finished ones are kept."""

    folder: Path
    window_steps: int = 8
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    _tails: dict[int, FileTail] = field(default_factory=dict)
    _last_step: dict[int, int] = field(default_factory=dict)  # rank -> its last step record

    def manifest(self) -> schema.Manifest | None:
        """The manifest as it is now; None while it is absent or being written."""
        try:
            return schema.read_manifest(self.folder)
        except (OSError, ValueError, schema.SchemaError):
            return None

    def poll(self, manifest: schema.Manifest) -> None:
        """Read what every rank file gained since the last poll."""
        for rank in range(manifest.world_size):
            for kind, record in self._new_records(rank):
                if kind == RecordKind.STEP.value:
                    self._last_step[rank] = max(self._last_step.get(rank, -1), record["step"])
                self.records.setdefault(kind, []).append(record)

    def finished_step(self, world_size: int) -> int | None:
        """The last step every rank has finished (its step record written), or None."""
        if len(self._last_step) < world_size:
            return None
        return min(self._last_step.values())

    def window(self, manifest: schema.Manifest, last: int) -> RunData:
        """The run's steps `last - window_steps + 1 .. last`, as a RunData; older records are
        dropped from memory."""
        first = max(0, last - self.window_steps + 1)
        self.records = {
            kind: [r for r in rows if r["step"] >= first] for kind, rows in self.records.items()
        }
        shown = {
            kind: [r for r in rows if r["step"] <= last] for kind, rows in self.records.items()
        }
        run = run_from_records(manifest, self.folder, shown, list(self.skipped))
        run.starts_at_warmup = first == 0
        return run

    def _new_records(self, rank: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(kind, record) of the records appended to the rank's file since the last read."""
        tail = self._tails.get(rank)
        if tail is None:
            tail = open_tail(self.folder, rank)
            if tail is None:
                return  # not created yet: the next poll looks again
            self._tails[rank] = tail
        new = tail.read_new()
        self.skipped += tail.notes
        tail.notes.clear()
        for record in new:
            if self._checked(record, tail.path.name):
                record["rank"] = rank
                kind = record["kind"]
                yield kind, _event_row(record) if kind == RecordKind.EVENT.value else record

    def _checked(self, record: Any, name: str) -> bool:
        """Whether the loader would use the record (a note for a bad one)."""
        reason = schema.check_record(record) or check_values(record)
        if reason:
            self.skipped.append(f"{name}: a record skipped ({reason})")
            return False
        return bool(record["kind"] in KINDS)


def _event_row(record: dict[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in record.items() if k not in ("kind", "step", "name", "rank")}
    return {"rank": record["rank"], "step": record["step"], "name": record["name"],
            "fields": fields}  # fmt: skip


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
    tail = RunTail(Path(folder), window_steps)
    log = FindingLog()
    started, analysed = clock(), None
    while True:
        manifest = tail.manifest()
        if manifest is None:
            if clock() - started > wait_s:
                raise InputError(folder, f"no readable manifest.json after {wait_s:.0f} s")
            time.sleep(min(interval_s, 0.5))
            continue
        ended = manifest.status != schema.RunStatus.RUNNING.value
        tail.poll(manifest)  # after reading the status: an ended run's files are complete
        last = tail.finished_step(manifest.world_size)
        if last is not None and last != analysed:
            analysed = last
            _, report = diagnose(tail.window(manifest, last), config)
            for line in log.update(report["findings"], last):
                print(line, file=stream, flush=True)
        if ended:
            print(f"diag watch: run {manifest.status} after step {analysed}", file=stream,
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
