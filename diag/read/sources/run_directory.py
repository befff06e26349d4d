"""Run directories (`diag.run/1`: manifest.json and a rank file per rank, docs/run-format.md), read
by `diag.read.load`; a large run's tables come from the cache beside it (`diag.read.cache`) when its
files have not changed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from diag.contract import schema
from diag.errors import InputError
from diag.read import cache
from diag.read.flight_recorder import FR_DIR, read_dumps
from diag.read.load import RunData, load_run, with_cache_note
from diag.read.sources.base import LoadOptions

CACHE_MIN_BYTES = 8 * 2**20
"""Run directories smaller than this are parsed again each time (well under a second)."""
CACHE_NAME = "run"
LOADER = __name__
"""The module whose code, with every diag module it imports (the loader), shapes the cached
tables; the module of the breakdown a large run is reduced with is added to the key."""


class RunDirectory:
    name = "run-directory"

    def detect(self, path: Path) -> bool:
        return (path / schema.MANIFEST_FILE).is_file()

    def load(self, path: Path, options: LoadOptions) -> RunData:
        if options.layout is not None:
            raise InputError(path, "--layout is for profiler trace folders; a run has its manifest")
        if input_bytes(path) < CACHE_MIN_BYTES:
            return with_failure_evidence(load_run(path, options.steps, options.breakdown))
        key = cache.table_key(
            cache.file_stamps(run_files(path)), options.steps, *loader_modules(options)
        )
        found = cache.read(path, CACHE_NAME, key)
        if isinstance(found.value, RunData):
            return with_failure_evidence(found.value)
        run = load_run(path, options.steps, options.breakdown)
        cache.write(path, CACHE_NAME, key, run, in_background=True)  # on the idle core
        return with_failure_evidence(with_cache_note(run, found.note))

    def cache_report(self, path: Path) -> bool:
        return input_bytes(path) >= CACHE_MIN_BYTES

    def profiler_traces(self, path: Path) -> Path | None:
        return path / schema.TRACES_DIR

    def profiler_window(self, path: Path) -> Path | None:
        traces = path / schema.TRACES_DIR
        return traces if traces.is_dir() else None


def run_files(folder: Path) -> list[Path]:
    """The manifest and the rank files, sorted; empty if the folder cannot be listed."""
    try:
        return sorted(
            p
            for p in folder.iterdir()
            if p.name == schema.MANIFEST_FILE or schema.RANK_FILE_RE.match(p.name)
        )
    except OSError:
        return []


def input_bytes(folder: Path) -> int:
    """The size of the run's manifest and rank files (0 when they cannot be listed)."""
    try:
        return sum(stamp[1] for stamp in cache.file_stamps(run_files(folder)))
    except OSError:
        return 0


RUN_DIRECTORY = RunDirectory()


def with_failure_evidence(run: RunData) -> RunData:
    """The run with what says whether it finished, read after its tables (never cached: it
    changes while they do not): each rank file's modification time and the Flight Recorder
    dumps beside it (RUN/flight-recorder/), whose unreadable files are noted."""
    mtimes: dict[int, float] = {}
    for path in run_files(run.path):
        found = schema.RANK_FILE_RE.match(path.name)
        if found is None:
            continue
        try:
            mtimes[int(found.group(1))] = path.stat().st_mtime
        except (OSError, ValueError, IndexError):
            continue
    folder = run.path / FR_DIR
    if not folder.is_dir():
        return dataclasses.replace(run, file_mtimes_s=mtimes)
    dumps = read_dumps(folder)
    return dataclasses.replace(
        run, file_mtimes_s=mtimes, flight_recorder=dumps.table,
        flight_recorder_ranks=list(dumps.ranks),
        skipped=[*run.skipped, *dumps.notes],
    )  # fmt: skip


def loader_modules(options: LoadOptions) -> list[str]:
    """The modules whose code shapes a run directory's tables under `options`: the loader and,
    where one is handed in, the breakdown's."""
    breakdown = options.breakdown
    return [LOADER] if breakdown is None else [LOADER, breakdown.__module__]
