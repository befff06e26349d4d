"""Which files of a folder are Kineto traces, and which folders hold them: `*.json` /
`*.json.gz` files whose head holds a key only a trace has (a folder with manifest.json is a
run directory, never a trace folder), and torchtitan's `iteration_N/` folders of them."""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

from diag.contract.files import open_regular
from diag.contract.limits import MAX_TRACE_FILE_BYTES, MAX_WORLD_SIZE
from diag.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(folder: Path) -> list[Path]:
    """Trace files directly in `folder` (sorted); a manifest's folder has none."""
    try:
        entries = sorted(folder.iterdir())
    except OSError as err:
        raise InputError(folder, f"cannot list the folder ({err.strerror or err})") from None
    return [p for p in entries if p.is_file() and p.name.endswith(TRACE_SUFFIXES)]


def is_trace_dir(folder: Path) -> bool:
    """A folder without manifest.json holding at least one Kineto trace file."""
    return (
        folder.is_dir()
        and not (folder / "manifest.json").exists()
        and any(_looks_like_trace(p) for p in trace_files(folder))
    )


def is_trace_file(path: Path) -> bool:
    """One Kineto trace file named on its own (a rank's `*.pt.trace.json[.gz]`)."""
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES) and _looks_like_trace(path)


_STEP_FOLDER = re.compile(r"iteration_(\d+)")


def step_folders(folder: Path) -> list[tuple[int, Path]]:
    """torchtitan's layout (`--profiling.enable_profiling`): a folder of `iteration_N/`
    folders, one per profiled window, each holding `rank{R}_trace.json` files; (N, folder) of
    those that hold traces, by N. Empty for any other folder."""
    if not folder.is_dir() or (folder / "manifest.json").exists():
        return []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    found = [(int(m.group(1)), p) for p in entries if (m := _STEP_FOLDER.fullmatch(p.name))]
    return sorted((n, p) for n, p in found if n < MAX_WORLD_SIZE**2 and is_trace_dir(p))


TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"')
HEAD_CHUNK_BYTES = 64 * 2**10
MAX_HEAD_BYTES = 4 * 2**20
"""How far into a file its trace keys are looked for: a trace may open with a long block of
its own (TraceLens' exports: 26 KB of `"metadata"` before `traceEvents`)."""


def _looks_like_trace(path: Path) -> bool:
    return why_not_a_trace(path) is None


def why_not_a_trace(path: Path) -> str | None:
    """None where the file's first MAX_HEAD_BYTES (inflated) hold a key only a Kineto trace
    has (read a chunk at a time up to the first found); else why it is no trace, in words."""
    longest = max(map(len, TRACE_KEYS))
    try:
        with open_regular(path, MAX_TRACE_FILE_BYTES) as raw:
            text = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
            seen, tail = 0, b""
            while seen < MAX_HEAD_BYTES and (chunk := text.read(HEAD_CHUNK_BYTES)):
                window = tail + chunk  # a key cut between two chunks is found whole
                if any(key in window for key in TRACE_KEYS):
                    return None
                if not seen and not chunk.lstrip().startswith(b"{"):
                    return "not a JSON object"  # read no further (a folder of other data)
                seen, tail = seen + len(chunk), window[-longest:]
    except (EOFError, zlib.error, gzip.BadGzipFile):
        return "a gzip cut short or corrupt"
    except OSError as err:  # contract.files.NotReadable too: its reason is its strerror
        return f"cannot be read ({err.strerror or err})"
    return "empty" if not seen else "no traceEvents in its head"


def why_no_traces(folder: Path, shown: int = 3) -> str | None:
    """Why the JSON files of a folder that holds no trace are none, the first `shown` of
    them by name (a job killed while its profiler wrote leaves them empty or cut short);
    None where the folder holds no JSON file."""
    try:
        files = trace_files(folder)
    except InputError:
        return None
    if not files:
        return None
    reasons = [f"{p.name} ({why_not_a_trace(p) or 'a trace'})" for p in files[:shown]]
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return f"its {len(files)} JSON file(s) hold no trace: {', '.join(reasons)}{more}"
