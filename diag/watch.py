"""`diag watch RUN`: the findings of a run while it trains, a line each time one appears, changes
severity or goes away, until the manifest says the run ended.

Every `interval_s` the rank files are read from where the last read stopped (only the bytes
appended since, whole lines only: a line still being written waits for the next read), each
record checked as the loader checks it (diag/schema.py, diag/record_checks.py: nothing is
executed, no line over MAX_LINE_BYTES is held, no nesting deeper than MAX_JSON_DEPTH is
parsed). The steps every rank has finished are analysed as a window of the last
`window_steps` (the rules see what the job does now, not its average since the start, so a
straggler that appears midway is named within a few steps), and older records are dropped, so
the memory stays that of the window however long the job runs.

A finding is the same finding while its rule and blamed ranks are (`rule`, `ranks`); it is
reported gone only after two analyses without it, so one noisy window does not make it flap.
JSON-lines rank files only: an Arrow rank file (`.arrows`, diag simulate) is analysed after the
run with `diag analyze`.
"""

from __future__ import annotations

import json
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
from diag.limits import MAX_JSON_DEPTH, MAX_LINE_BYTES
from diag.load import RunData, run_from_records
from diag.record_checks import check_values, depth
from diag.report import finding_head
from diag.schema import RecordKind
from diag.shell import fail, project_config, rule_thresholds

READ_MAX_BYTES = 64 * 2**20
"""Bytes read from one rank file per poll at most (a long backlog is read over several)."""
KINDS = frozenset(k.value for k in RecordKind)
GONE_AFTER = 2
"""Analyses in a row without a finding before it is reported gone."""


@dataclass
class _Tail:
    """One rank file, read up to `offset`."""

    path: Path
    offset: int = 0


@dataclass
class RunTail:
    """A growing run directory, read a poll at a time; the records of unfinished steps and of
    the last `window_steps` finished ones are kept."""

    folder: Path
    window_steps: int = 8
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    _tails: dict[int, _Tail] = field(default_factory=dict)
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
            tail = self._tails.setdefault(rank, _Tail(self.folder / schema.rank_file_name(rank)))
            for kind, record in self._new_records(rank, tail):
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

    def _new_records(self, rank: int, tail: _Tail) -> Iterator[tuple[str, dict[str, Any]]]:
        """(kind, record) of the whole lines appended to the rank file since the last read."""
        try:
            with tail.path.open("rb") as fh:
                fh.seek(tail.offset)
                data = fh.read(READ_MAX_BYTES)
        except OSError:
            return  # not created yet, or being replaced: the next poll reads it
        end = data.rfind(b"\n") + 1
        if end == 0:
            if len(data) > MAX_LINE_BYTES:  # a line that never ends: skip what was read
                tail.offset += len(data)
                self.skipped.append(f"{tail.path.name}: a line longer than {MAX_LINE_BYTES} "
                                    "bytes, skipped")  # fmt: skip
            return
        tail.offset += end
        for line in data[:end].split(b"\n"):
            record = self._checked(line, tail.path.name)
            if record is not None:
                record["rank"] = rank
                kind = record["kind"]
                yield kind, _event_row(record) if kind == RecordKind.EVENT.value else record

    def _checked(self, line: bytes, name: str) -> dict[str, Any] | None:
        """The line's record when the loader would use it, else None (a note for a bad one)."""
        if not line.strip():
            return None
        if len(line) > MAX_LINE_BYTES:
            self.skipped.append(f"{name}: a line longer than {MAX_LINE_BYTES} bytes, skipped")
            return None
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            self.skipped.append(f"{name}: a line that is not valid JSON, skipped")
            return None
        if depth(record) > MAX_JSON_DEPTH:
            self.skipped.append(f"{name}: a record nested too deeply, skipped")
            return None
        reason = schema.check_record(record) or check_values(record)
        if reason:
            self.skipped.append(f"{name}: a record skipped ({reason})")
            return None
        return record if record["kind"] in KINDS else None


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
