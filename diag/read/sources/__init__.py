"""Input formats, one module each, found through one registry: a path in, `RunData` out.

A source says whether a path is its format (`detect`) and loads it (`load`), with its own
caching and the options it accepts (a layout for trace folders, a window of steps for run
directories). Adding a format is one new module here and one line in `SOURCES`
(docs/architecture.md).
"""

from __future__ import annotations

from pathlib import Path

from diag.read.load import RunData
from diag.read.sources.base import LoadOptions, Source
from diag.read.sources.flight_recorder import FLIGHT_RECORDER
from diag.read.sources.profiler_traces import PROFILER_TRACES
from diag.read.sources.run_directory import RUN_DIRECTORY

__all__ = ["SOURCES", "LoadOptions", "Source", "find_source", "load_any"]

SOURCES: tuple[Source, ...] = (PROFILER_TRACES, FLIGHT_RECORDER, RUN_DIRECTORY)
"""In the order they are asked; the last (run directories) also answers for unknown paths."""


def find_source(path: str | Path) -> Source:
    """The source whose format `path` is; the run directory when none claims it (its loader
    names what is wrong with the path)."""
    folder = Path(path)
    return next((source for source in SOURCES if source.detect(folder)), SOURCES[-1])


def load_any(path: str | Path, options: LoadOptions | None = None) -> RunData:
    """Load `path` with the source of its format."""
    folder = Path(path)
    return find_source(folder).load(folder, options or LoadOptions())
