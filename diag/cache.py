"""A cache beside the data: the second load of an unchanged run directory or trace folder reads
one pickle instead of parsing again, and the second analysis with the same options reads the
finished report.

The cache sits in the folder (`FOLDER/.diag-cache/`), or, when that folder is read-only, under
`$XDG_CACHE_HOME/diag/` (default `~/.cache/diag/`) keyed by the folder's absolute path. An entry
is used only when its key matches; keys are built from the files' names, sizes and modification
times, the options and the code that produced the entry. Only diag writes these files; a cache
folder writable by others should not be trusted (pickle), so the user cache is the fallback.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diag.load import RunData

CACHE_DIR = ".diag-cache"
REPORT_FILE = "report.json"
_DIAG = Path(__file__).parent


def file_stamps(files: Iterable[Path]) -> list[tuple[str, int, int]]:
    """Name, size and modification time (ns) of each file: what says it changed."""
    stamps = []
    for path in files:
        status = path.stat()
        stamps.append((path.name, status.st_size, status.st_mtime_ns))
    return stamps


def code_digest(*sources: Path) -> str:
    """The given source files' contents, so a changed diag never reads an older entry."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _places(folder: Path, name: str) -> list[Path]:
    """Beside the data unless its folder is read-only by its mode (root may write anywhere:
    the mode says what the owner meant), then the user's cache."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    user = home / "diag" / digest / name
    try:
        writable = bool(folder.stat().st_mode & stat.S_IWUSR)
    except OSError:
        writable = False
    return [folder / CACHE_DIR / name, user] if writable else [user]


def read(folder: Path, name: str, wanted: str) -> RunData | None:
    """The cached tables `name` of `folder` if stored under the key `wanted`."""
    for place in _places(folder, name):
        try:
            with place.open("rb") as fh:
                stored_key, run = pickle.load(fh)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, AttributeError):
            continue
        if stored_key == wanted and isinstance(run, RunData):
            return run
    return None


def write(folder: Path, name: str, new_key: str, run: RunData) -> Path | None:
    """Store the tables in the first writable place; None when none is (the analysis goes
    on)."""
    for place in _places(folder, name):
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


def report_key(folder: Path, options: Any) -> str:
    """The key of a finished analysis: the folder's files (and those of its `traces/`), every
    source file of diag (rules and reports change with it), the folder's absolute path and
    the analysis options (thresholds, --hta)."""
    digest = hashlib.sha256(repr((options, str(folder.resolve()))).encode())
    for source in sorted(_DIAG.rglob("*.py")):
        digest.update(source.read_bytes())
    for sub in (folder, folder / "traces"):
        if sub.is_dir():
            files = sorted(p for p in sub.iterdir() if p.is_file())
            digest.update(repr(file_stamps(files)).encode())
    return digest.hexdigest()


def read_report(folder: Path, wanted: str) -> dict[str, Any] | None:
    for place in _places(folder, REPORT_FILE):
        try:
            stored = json.loads(place.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(stored, dict) and stored.get("key") == wanted:
            report = stored.get("report")
            return report if isinstance(report, dict) else None
    return None


def write_report(folder: Path, new_key: str, report: dict[str, Any]) -> None:
    """Store a finished report (JSON) where the tables go; silently nowhere if unwritable."""
    for place in _places(folder, REPORT_FILE):
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            partial = place.with_suffix(".partial")
            partial.write_text(json.dumps({"key": new_key, "report": report}), encoding="utf-8")
            partial.replace(place)
            return
        except (OSError, TypeError, ValueError):
            continue
