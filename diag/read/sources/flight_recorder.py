"""A folder of PyTorch Flight Recorder dumps alone (one file per rank, `rank-NNNNN.json` or
the pickles `torch` writes): no step, span or comm record, only the collectives each rank's
recorder holds (`RunData.flight_recorder`), read by `diag.read.flight_recorder`. Enough for
the failure findings (who waits in which collective, who never joined, a desync); the
performance figures are empty."""

from __future__ import annotations

import dataclasses
import datetime as _dt
from pathlib import Path

from diag.contract import schema
from diag.contract.limits import MAX_WORLD_SIZE
from diag.errors import InputError
from diag.read.flight_recorder import dump_files, looks_like_dump, partial_dumps, read_dumps
from diag.read.load import RunData, empty_run
from diag.read.sources.base import LoadOptions

GIVEN = "given"
UNKNOWN_LAYOUT = "unknown: Flight Recorder dumps name their groups, not the axis of each"
NOT_GIVEN = f"{schema.SCHEDULE_UNKNOWN}not given (--layout m=N,v=N)"
"""A given layout without micro-batches and virtual stages: dumps do not say them."""


class FlightRecorderDumps:
    name = "flight-recorder"

    def detect(self, path: Path) -> bool:
        if not path.is_dir() or (path / schema.MANIFEST_FILE).exists():
            return False
        files = dump_files(path)
        if not files:  # dumps begun and cut off only: read as dumps, to say so
            return bool(partial_dumps(path))
        return looks_like_dump(files[0][1])

    def load(self, path: Path, options: LoadOptions) -> RunData:
        if options.steps is not None:
            raise InputError(path, "--steps is for run directories; a dump holds no steps")
        dumps = read_dumps(path)
        if not dumps.ranks:
            reason = dumps.notes[0] if dumps.notes else "no readable dump"
            raise InputError(path, f"no Flight Recorder dump could be read ({reason})")
        world = min(max(*dumps.ranks, dumps.highest_member) + 1, MAX_WORLD_SIZE)
        # a dump names its groups but not which of dp, tp, pp or ep each is, nor whether the
        # job ran on: both unknown until given (--layout) or derived (the failure analysis
        # derives the status from the entries: `summary.status`, which the report shows)
        layout = options.layout or schema.Layout()
        schedule_given = bool(layout.microbatches and layout.virtual_stages)
        zero_given = layout.zero_stage != schema.NOT_GIVEN_ZERO
        layout = dataclasses.replace(layout, microbatches=layout.microbatches or 1,
                                     virtual_stages=layout.virtual_stages or 1,
                                     zero_stage=max(layout.zero_stage, 0))  # fmt: skip
        not_given = "" if zero_given else f"; {schema.ZERO_UNKNOWN}not given"
        manifest = schema.Manifest(
            run_id=path.resolve().name,
            created=_dt.datetime.fromtimestamp(_newest(path), _dt.UTC).isoformat(),
            world_size=world,
            trainer="flight-recorder",
            layout=layout,
            ranks=[schema.RankInfo(rank=r) for r in dumps.ranks],
            status=schema.RunStatus.UNKNOWN.value,
            layout_source=(GIVEN if schedule_given else f"{GIVEN}; {NOT_GIVEN}") + not_given
            if options.layout
            else UNKNOWN_LAYOUT,
        )
        missing = sorted(set(range(world)) - set(dumps.ranks))
        notes = list(dumps.notes)
        if missing:
            shown = ", ".join(str(r) for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
            notes.append(f"{path}: no Flight Recorder dump of rank(s) {shown}")
        notes.append(f"{path}: Flight Recorder dumps alone: no steps, the failure only")
        if options.layout is None and world > 1:
            notes.append(f"{path}: layout unknown (the dumps' groups do not say which axis each "
                         "is): --layout gives it")  # fmt: skip
        run = empty_run(manifest, path, notes)
        return dataclasses.replace(
            run, flight_recorder=dumps.table, flight_recorder_ranks=list(dumps.ranks)
        )

    def cache_report(self, path: Path) -> bool:
        return False

    def profiler_traces(self, path: Path) -> Path | None:
        return None

    def profiler_window(self, path: Path) -> Path | None:
        return None


def _newest(folder: Path) -> float:
    times = []
    for _, path in dump_files(folder):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


FLIGHT_RECORDER = FlightRecorderDumps()
