"""A cache of converted trace folders: the second load of an unchanged folder reads one
pickle instead of parsing the JSON again, and the second analysis with the same options reads
the finished report.

The cache sits beside the traces (`TRACE_DIR/.diag-cache/`), or, when that folder is read-only,
under `$XDG_CACHE_HOME/diag/` (default `~/.cache/diag/`) keyed by the folder's absolute path.
An entry is used only when its key matches: the files' names, sizes and modification times,
the kernel patterns, the layout and the format version. Only diag writes these files; a cache
folder writable by others should not be trusted (pickle), so the user cache is the fallback.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
from pathlib import Path
from typing import Any

from diag import schema
from diag.kineto.kernels import KernelPatterns
from diag.load import RunData

FORMAT = 1  # bump when the cached objects change shape
_CONVERTERS = ("convert.py", "device.py", "events.py", "files.py", "kernels.py", "__init__.py")
CACHE_DIR = ".diag-cache"
CACHE_FILE = "kineto.pickle"


def key(files: list[Path], patterns: KernelPatterns, layout: schema.Layout | None) -> str:
    parts: list[Any] = [FORMAT, _code_digest(), repr(patterns), repr(layout)]
    for path in files:
        stat = path.stat()
        parts.append((path.name, stat.st_size, stat.st_mtime_ns))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _code_digest() -> str:
    """The converter's own source, so a changed diag never reads an older conversion."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in _CONVERTERS:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def _places(folder: Path) -> list[Path]:
    """Beside the traces unless their folder is read-only by its mode (root may write
    anywhere: the mode says what the owner meant), then the user's cache."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    user = home / "diag" / digest / CACHE_FILE
    try:
        writable = bool(folder.stat().st_mode & stat.S_IWUSR)
    except OSError:
        writable = False
    return [folder / CACHE_DIR / CACHE_FILE, user] if writable else [user]


def read(folder: Path, wanted: str) -> RunData | None:
    for place in _places(folder):
        try:
            with place.open("rb") as fh:
                stored_key, run = pickle.load(fh)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, AttributeError):
            continue
        if stored_key == wanted and isinstance(run, RunData):
            return run
    return None


def write(folder: Path, new_key: str, run: RunData) -> Path | None:
    """Store the run in the first writable place; None when none is (the analysis goes on)."""
    for place in _places(folder):
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            partial = place.with_suffix(".partial")
            with partial.open("wb") as fh:
                pickle.dump((new_key, run), fh, protocol=pickle.HIGHEST_PROTOCOL)
            partial.replace(place)
            return place
        except OSError:
            continue
    return None


REPORT_FILE = "report.json"


def report_key(folder: Path, options: Any) -> str:
    """The key of a finished analysis: the traces (as for the tables), every source file of
    diag (rules and reports change with it) and the analysis options (thresholds, --hta)."""
    digest = hashlib.sha256(repr(options).encode())
    for source in sorted(Path(__file__).parents[1].rglob("*.py")):
        digest.update(source.read_bytes())
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        stat_result = path.stat()
        digest.update(repr((path.name, stat_result.st_size, stat_result.st_mtime_ns)).encode())
    return digest.hexdigest()


def read_report(folder: Path, wanted: str) -> dict[str, Any] | None:
    for place in _places(folder):
        try:
            stored = json.loads(place.with_name(REPORT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(stored, dict) and stored.get("key") == wanted:
            report = stored.get("report")
            return report if isinstance(report, dict) else None
    return None


def write_report(folder: Path, new_key: str, report: dict[str, Any]) -> None:
    """Store a finished report (JSON) where the tables go; silently nowhere if unwritable."""
    for place in _places(folder):
        try:
            target = place.with_name(REPORT_FILE)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            partial.write_text(json.dumps({"key": new_key, "report": report}), encoding="utf-8")
            partial.replace(target)
            return
        except (OSError, TypeError, ValueError):
            continue
