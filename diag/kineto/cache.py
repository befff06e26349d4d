"""The key of a converted trace folder in the cache beside it (diag/cache.py): the trace
files' names, sizes and modification times, the kernel patterns, the layout, the format
version and the converter's own source."""

from __future__ import annotations

import hashlib
from pathlib import Path

from diag import cache, schema
from diag.kineto.kernels import KernelPatterns
from diag.load import RunData

FORMAT = 1  # bump when the cached objects change shape
_CONVERTERS = ("convert.py", "device.py", "events.py", "files.py", "kernels.py", "__init__.py")
CACHE_FILE = "kineto.pickle"


def key(files: list[Path], patterns: KernelPatterns, layout: schema.Layout | None) -> str:
    here = Path(__file__).parent
    code = cache.code_digest(*(here / name for name in _CONVERTERS))
    parts = [FORMAT, code, repr(patterns), repr(layout), cache.file_stamps(files)]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def read(folder: Path, wanted: str) -> RunData | None:
    return cache.read(folder, CACHE_FILE, wanted)


def write(folder: Path, new_key: str, run: RunData) -> Path | None:
    return cache.write(folder, CACHE_FILE, new_key, run)
