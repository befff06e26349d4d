"""The key of a converted trace folder in the cache beside it (diag/read/cache.py): the trace files'
names, sizes and modification times, the kernel patterns, the layout, and the source of the
converter with every diag module it imports."""

from __future__ import annotations

from pathlib import Path

from diag.contract import schema
from diag.read import cache
from diag.read.kineto.kernels import KernelPatterns
from diag.read.load import RunData

CACHE_NAME = "kineto"
CONVERTER = "diag.read.kineto"
"""The package whose code (with every diag module it imports) shapes the cached tables."""


def key(
    files: list[Path], patterns: KernelPatterns, layout: schema.Layout | None, reduced: bool = False
) -> str:
    """`reduced`: the folder is reduced to a window (window.py), its tables not the whole's."""
    options = (patterns, layout) + (("reduced",),) * reduced
    return cache.table_key(cache.file_stamps(files), options, CONVERTER)


def read(folder: Path, wanted: str) -> cache.Lookup:
    return cache.read(folder, CACHE_NAME, wanted)


def write(folder: Path, new_key: str, run: RunData) -> Path | None:
    return cache.write(folder, CACHE_NAME, new_key, run)
