"""What every input format provides (`Source`) and what a load may be asked (`LoadOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from diag.contract import schema
from diag.read.load import Breakdown, RunData


@dataclass(frozen=True)
class LoadOptions:
    """What a user may ask of a load: `layout` (how a trace folder's ranks are laid out; a run
    directory has its manifest) and `steps` (a window of a run directory's steps); and what the
    caller hands the reader: `breakdown`, the per-file reduction a large run's workers apply
    (the metrics' `reduce_rank_files`, handed in by `diag.api`: the readers import no metric
    code). Without one a large run keeps every record."""

    layout: schema.Layout | None = None
    steps: range | None = None
    breakdown: Breakdown | None = None


class Source(Protocol):
    """One input format."""

    name: str

    def detect(self, path: Path) -> bool:
        """Whether `path` is this format (cheap: a look at names and first bytes)."""
        ...

    def load(self, path: Path, options: LoadOptions) -> RunData:
        """The run's tables; raises `InputError` (one line) on unusable input or options."""
        ...

    def cache_report(self, path: Path) -> bool:
        """Whether a finished report of `path` is worth caching beside it."""
        ...

    def profiler_traces(self, path: Path) -> Path | None:
        """The folder of profiler traces that belongs to this input (for HTA's analyses)."""
        ...

    def profiler_window(self, path: Path) -> Path | None:
        """A folder of profiler traces captured beside the run (a window of its steps),
        analysed into the report's `traces` section; None when there is none."""
        ...
