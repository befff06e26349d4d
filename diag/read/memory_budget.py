"""How many traces are parsed at once: as many as the memory allows, not as many as cores.

A worker parsing a trace holds a multiple of the trace's JSON at its peak (docs/scale.md, "A
worker's parse": 1.6-2.3x over its imports), so the cores alone are the wrong bound: sixteen
workers on a machine of sixteen cores, each reading a 650 MB trace, want about 26 GiB at
once. Here a parse is started only while the parses in flight, at their estimated peaks, and
this process's own memory fit the budget; one is always started when none is in flight (the
folder must be read), and the budget then says it was exceeded.

The budget is `diag analyze --memory-budget`, else $DIAG_MEMORY_BUDGET, else three quarters
of the memory the machine has available when the analysis starts (none where that is not
known: the cores alone bound it, as before). It bounds this machine's worker processes; on a
Dask cluster (`--scheduler`) each worker's own memory limit does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MEMORY_ENV = "DIAG_MEMORY_BUDGET"
PARSE_BYTES_PER_JSON_BYTE = 2.0
"""A trace's parse at its peak over the worker's imports, per byte of its JSON: measured 1.6x
on a 650 MB simulated trace and 1.65x on a 79 MiB one (docs/scale.md, "The memory budget");
a trace of another shape may take more."""
WORKER_BASE_BYTES = 128 * 2**20
"""A worker's own memory beside its parse (its share of the imports: about 113 MiB)."""
SHARE_OF_AVAILABLE = 0.75
"""The default budget: this share of the machine's available memory at the start."""

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_budget: int | None = None


def parse_size(text: str) -> int:
    """Bytes from `2GiB`, `2G`, `1536MiB`, `512m` or a plain number of bytes; ValueError
    naming the text otherwise."""
    found = _SIZE.match(text)
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"not a memory size: {text!r} (e.g. 2GiB, 1536MiB)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def use_budget(size_bytes: int | None) -> None:
    """From now on, parse within `size_bytes` (None: the environment's, else the default);
    what `diag analyze --memory-budget` sets."""
    global _budget
    _budget = size_bytes


def budget_bytes() -> int | None:
    """The memory the parses and this process may hold together (see the module's text);
    None: no bound known beyond the cores. A malformed $DIAG_MEMORY_BUDGET is ignored."""
    if _budget is not None:
        return _budget
    forced = os.environ.get(MEMORY_ENV, "").strip()
    if forced:
        try:
            return parse_size(forced)
        except ValueError:
            pass
    available = available_bytes()
    return None if available is None else int(available * SHARE_OF_AVAILABLE)


def available_bytes() -> int | None:
    """The machine's available memory (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes() -> int:
    """This process's resident memory now (0 where unknown)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def parse_peak_bytes(json_bytes: int) -> int:
    """A worker's estimated peak while it parses a trace of `json_bytes` of JSON."""
    return int(PARSE_BYTES_PER_JSON_BYTE * max(json_bytes, 0)) + WORKER_BASE_BYTES


@dataclass
class Admission:
    """Which parse may start now (`admits`), within `budget` bytes, from each chunk's
    estimated peak (`peaks`); what it did, for the report's note."""

    budget: int
    peaks: Sequence[int]
    most_at_once: int = 0
    over_budget: list[int] = field(default_factory=list)  # chunks started alone, past it

    def admits(self, index: int, in_flight: Iterable[int]) -> bool:
        """Whether chunk `index` may start beside the chunks `in_flight`."""
        running = list(in_flight)
        held = rss_bytes() + sum(self.peaks[i] for i in running) + self.peaks[index]
        if running and held > self.budget:
            return False
        if not running and held > self.budget:
            self.over_budget.append(index)
        self.most_at_once = max(self.most_at_once, len(running) + 1)
        return True

    def note(self, workers: int, what: str = "traces") -> str | None:
        """A line for the report where the budget held the parses below `workers` at once,
        or where a parse alone was estimated past it; None where it changed nothing."""
        gib = self.budget / 2**30
        if self.most_at_once == 0:  # never asked: the files were parsed in this process
            return None
        if self.over_budget:
            return (f"memory budget {gib:.1f} GiB: {len(self.over_budget)} of the {what} were "
                    f"estimated to need more alone, and were parsed one at a time")  # fmt: skip
        if self.most_at_once < workers:
            return (f"memory budget {gib:.1f} GiB: {what} parsed {self.most_at_once} at a time "
                    f"at most, not {workers} (diag analyze --memory-budget)")  # fmt: skip
        return None


def admission(json_sizes: Sequence[int]) -> Admission | None:
    """An Admission over traces of `json_sizes` bytes within `budget_bytes()`, or None where
    there is no budget."""
    budget = budget_bytes()
    if budget is None:
        return None
    return Admission(budget, [parse_peak_bytes(size) for size in json_sizes])
