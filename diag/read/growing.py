"""A growing run directory read a poll at a time (`diag.RunTail`, for `diag watch` and the live
dashboard): only the bytes appended since the last read (diag/rankfile/tail.py), each record
checked as the loader checks it, the records of unfinished steps and of the last `window_steps`
finished ones kept, so the memory stays that of the window however long the job runs; or, for an
incremental analysis (diag/metrics/live.py), the records of finished steps handed over once
(`take`) and dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.contract import schema
from diag.contract.schema import RecordKind
from diag.rankfile.record_checks import check_values, float_tokens
from diag.rankfile.tail import FileTail, open_tail
from diag.read.load import RunData, run_from_records

KINDS = frozenset(k.value for k in RecordKind)
PROGRESS_KINDS = frozenset({RecordKind.STEP.value, RecordKind.SPAN.value, RecordKind.COMM.value})
"""Records that say a rank moved on (a heartbeat says only that it is alive)."""
MAX_OPEN = 256
"""Open collectives and spans kept per rank (a flush writes the few in flight)."""


@dataclass
class Activity:
    """What one rank's records said as they arrived, timed on the reader's clock (`now_s`
    handed to `RunTail.poll`): when its last record and its last progress arrived, its last
    step, what it left open (collectives by (group, seq), spans by (step, phase, mb)), its
    `stall`, `exception` and `rank_closed`, and its heartbeat period. `diag watch` names a
    silent rank from it (diag/metrics/live.py)."""

    last_record_s: float | None = None
    last_progress_s: float | None = None
    last_step: int | None = None
    step_walls_ns: list[int] = field(default_factory=list)
    open_comms: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    open_spans: dict[tuple[int, str, int], dict[str, Any]] = field(default_factory=dict)
    stall: dict[str, Any] | None = None
    exception: dict[str, Any] | None = None
    closed: str | None = None
    heartbeat_s: float | None = None
    skew_s: float | None = None
    """The reader's clock minus the rank's, at the record read soonest (`_progress`)."""

    def take(self, kind: str, record: dict[str, Any], now_s: float) -> None:
        self.last_record_s = now_s
        if kind in PROGRESS_KINDS:
            self._progress(record, now_s)
            self.stall = None  # progress ends a stall episode
        if kind == RecordKind.STEP.value:
            self.last_step = max(self.last_step or 0, int(record["step"]))
            if len(self.step_walls_ns) < 4096:
                self.step_walls_ns.append(int(record["t1"]) - int(record["t0"]))
        elif kind == RecordKind.SPAN.value:
            self.open_spans.pop(_span_key(record["step"], record), None)
        elif kind == RecordKind.COMM.value:
            self._completed(record)
        elif kind == RecordKind.EVENT.value:
            self._event(record)

    def _progress(self, record: dict[str, Any], now_s: float) -> None:
        """When the rank progressed: its record's end on the reader's clock. The rank's clock
        and the reader's differ by a constant (and the read's lag): the smallest difference
        seen (`skew_s`, the record read soonest after it was written) maps one to the other,
        so a batch of records read late still dates the progress when it happened."""
        end = record.get("t1", record.get("t0"))
        if not isinstance(end, int) or isinstance(end, bool):
            self.last_progress_s = now_s
            return
        seen = now_s - end / 1e9
        self.skew_s = seen if self.skew_s is None else min(self.skew_s, seen)
        at = end / 1e9 + self.skew_s
        self.last_progress_s = at if self.last_progress_s is None else max(self.last_progress_s, at)

    def _completed(self, record: dict[str, Any]) -> None:
        group, seq = str(record.get("group")), record.get("seq")
        if isinstance(seq, int):
            self.open_comms.pop((group, seq), None)
        for key, issued in list(self.open_comms.items()):  # no seq: the same issue time
            if key[0] == group and issued.get("t0") == record.get("t0"):
                self.open_comms.pop(key)

    def _event(self, record: dict[str, Any]) -> None:
        name, fields, step = record.get("name"), record.get("fields") or {}, record["step"]
        if name == "comm_issued" and isinstance(fields.get("seq"), int):
            if len(self.open_comms) < MAX_OPEN:
                self.open_comms[(str(fields.get("group")), fields["seq"])] = {
                    "step": step,
                    **fields,
                }
        elif name == "span_open" and len(self.open_spans) < MAX_OPEN:
            self.open_spans[_span_key(step, fields)] = {"step": step, **fields}
        elif name == "stall":
            self.stall = {"step": step, **fields}
        elif name == "exception" and self.exception is None:
            self.exception = {"step": step, **fields}
        elif name == "rank_closed":
            self.closed = str(fields.get("status"))
        elif name == "heartbeat":
            interval = fields.get("interval_s")
            if isinstance(interval, int | float) and 0 < interval < 3600:
                self.heartbeat_s = float(interval)


def _span_key(step: Any, fields: dict[str, Any]) -> tuple[int, str, int]:
    mb = fields.get("mb")
    return (int(step), str(fields.get("phase")), mb if isinstance(mb, int) else 0)


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
    activity: dict[int, Activity] = field(default_factory=dict)
    """Per rank, what its records said as they arrived (`Activity`)."""

    def manifest(self) -> schema.Manifest | None:
        """The manifest as it is now; None while it is absent or being written."""
        try:
            return schema.read_manifest(self.folder)
        except (OSError, ValueError, schema.SchemaError):
            return None

    def poll(self, manifest: schema.Manifest, now_s: float | None = None) -> None:
        """Read what every rank file gained since the last poll; `now_s` (the reader's clock)
        times each rank's `activity`."""
        for rank in range(manifest.world_size):
            for kind, record in self._new_records(rank):
                if now_s is not None:
                    self.activity.setdefault(rank, Activity()).take(kind, record, now_s)
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
        return dataclasses.replace(run, starts_at_warmup=first == 0)

    def take(self, manifest: schema.Manifest, last: int) -> RunData:
        """The records of every step up to `last` not taken before, as a RunData, dropped
        from memory: what an incremental analysis (`diag.LiveRun`) turns into its per-step
        tables once, so that it never reads a record twice."""
        taken: dict[str, list[dict[str, Any]]] = {}
        for kind, rows in self.records.items():
            taken[kind] = [r for r in rows if r["step"] <= last]
            self.records[kind] = [r for r in rows if r["step"] > last]
        notes: list[str] = []  # repeated step records, the last of each kept
        run = run_from_records(manifest, self.folder, taken, notes)
        self.skipped += notes
        return dataclasses.replace(run, starts_at_warmup=False, skipped=[])

    def files(self) -> list[Path]:
        """The rank files found so far."""
        return [tail.path for tail in self._tails.values()]

    def rank_files(self) -> dict[int, Path]:
        """The rank files found so far, by rank."""
        return {rank: tail.path for rank, tail in self._tails.items()}

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
                record = float_tokens(record)
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
