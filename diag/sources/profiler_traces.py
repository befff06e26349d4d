"""PyTorch profiler (Kineto) trace folders: `*.pt.trace.json[.gz]`, one per rank, read by
`diag.kineto` (which caches the converted tables beside the folder)."""

from __future__ import annotations

from pathlib import Path

from diag.errors import InputError
from diag.kineto import is_trace_dir, load_trace_dir
from diag.load import RunData
from diag.sources.base import LoadOptions


class ProfilerTraces:
    name = "profiler-traces"

    def detect(self, path: Path) -> bool:
        return is_trace_dir(path)

    def load(self, path: Path, options: LoadOptions) -> RunData:
        if options.steps is not None:
            raise InputError(path, "--steps is for run directories; a trace holds its own window")
        return load_trace_dir(path, layout=options.layout)

    def cache_report(self, path: Path) -> bool:
        return True  # parsing traces costs seconds even for a few ranks

    def profiler_traces(self, path: Path) -> Path | None:
        return path

    def profiler_window(self, path: Path) -> Path | None:
        return None  # the folder is the traces themselves


PROFILER_TRACES = ProfilerTraces()
