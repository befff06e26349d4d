"""PyTorch profiler (Kineto) trace folders: `*.pt.trace.json[.gz]`, one per rank, read by
`diag.read.kineto` (which caches the converted tables beside the folder). A folder of torchtitan's
`iteration_N/` windows reads its latest window (the note says which; name another to read it);
one trace file named on its own is read as the traces of that one rank."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from diag.errors import InputError
from diag.read.kineto import is_trace_dir, load_trace_dir
from diag.read.kineto.trace_folder import is_trace_file, step_folders
from diag.read.load import RunData
from diag.read.sources.base import LoadOptions


class ProfilerTraces:
    name = "profiler-traces"

    def detect(self, path: Path) -> bool:
        return is_trace_dir(path) or bool(step_folders(path)) or is_trace_file(path)

    def load(self, path: Path, options: LoadOptions) -> RunData:
        if options.steps is not None:
            raise InputError(path, "--steps is for run directories; a trace holds its own window")
        folder, notes = _traces_of(path)
        run = load_trace_dir(folder, layout=options.layout, breakdown=options.breakdown)
        return dataclasses.replace(run, skipped=[*run.skipped, *notes]) if notes else run

    def cache_report(self, path: Path) -> bool:
        # parsing traces costs seconds even for a few ranks; a folder of windows is cached in
        # the window read (its report key follows that folder's files)
        return is_trace_dir(path)

    def profiler_traces(self, path: Path) -> Path | None:
        return _traces_of(path)[0]

    def profiler_window(self, path: Path) -> Path | None:
        return None  # the folder is the traces themselves


def _traces_of(path: Path) -> tuple[Path, list[str]]:
    """The folder holding the traces to read, and a note when it is a window of several."""
    if is_trace_dir(path) or is_trace_file(path):
        return path, []
    windows = step_folders(path)
    if not windows:
        return path, []
    folder = windows[-1][1]
    others = ", ".join(p.name for _, p in windows[:-1][-3:])
    note = f"{path}: read {folder.name}, the latest of {len(windows)} profiled windows"
    return folder, [note + (f" (analyse {others} by naming it)" if others else "")]


PROFILER_TRACES = ProfilerTraces()
