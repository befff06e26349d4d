"""A folder of Kineto traces (`torch.profiler` + `tensorboard_trace_handler`): one
`*.json` / `*.json.gz` file per rank. Which rank a file holds comes from its `distributedInfo`,
else from a number in its name (`rank3`, `rank-3`, `rank_3`); a file with neither, or two files
claiming one rank, is an error that lists the files."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from diag.errors import InputError
from diag.kineto.convert import scan, to_records
from diag.kineto.device import DeviceTime, device_time
from diag.kineto.events import DECODER, Trace, event_from
from diag.kineto.kernels import KernelPatterns

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)


@dataclass
class ParsedTrace:
    """One trace file read and converted (in a worker process when there are several)."""

    path: Path
    rank: int | None  # None: neither distributedInfo nor the file name says
    world_size: int | None  # from distributedInfo
    backend: str | None
    device_name: str | None
    records: dict[str, list[dict[str, Any]]]  # converted with rank 0 when `rank` is None
    error: str | None = None  # the one-line reason the file is unusable
    on_device: bool = False  # the trace has GPU kernels or copies
    device_time: DeviceTime | None = None  # None: no device kernels to measure


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


def _looks_like_trace(path: Path) -> bool:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            head = fh.read(4096)
    except (OSError, UnicodeDecodeError, EOFError):
        return False
    return "traceEvents" in head or '"schemaVersion"' in head or '"distributedInfo"' in head


def read_trace(path: Path) -> Trace:
    """The trace's events and metadata; InputError naming the file on a truncated or invalid
    one. Typed decoding first; a trace it refuses (an event that is not an object, a top level
    of another shape) is parsed as plain JSON and its objects kept."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (EOFError, gzip.BadGzipFile) as err:
        raise InputError(path, f"truncated or corrupt gzip ({err})") from None
    except OSError as err:
        raise InputError(path, f"cannot read ({err.strerror or err})") from None
    try:
        return DECODER.decode(raw)
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError:
        pass  # NaN and other things the standard parser accepts, or the reason it gives
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise InputError(path, f"not valid JSON: {err.msg} at line {err.lineno}") from None
    except UnicodeDecodeError as err:
        raise InputError(path, f"not UTF-8 text ({err.reason})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(path, "not a Kineto trace (no traceEvents list)")
    events = [e for e in map(event_from, data["traceEvents"]) if e is not None]
    return Trace(events, data.get("distributedInfo"), data.get("deviceProperties"))


def rank_of(path: Path, data: Trace) -> int | None:
    info = data.distributedInfo
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    found = _RANK_IN_NAME.search(path.name)
    return int(found.group(1)) if found else None


def parse_file(path: Path, patterns: KernelPatterns) -> ParsedTrace:
    """Read one trace and convert its events to records; errors are kept, not raised."""
    try:
        data = read_trace(path)
    except InputError as error:
        return ParsedTrace(path, None, None, None, None, {}, error=str(error))
    info: dict[str, Any] = data.distributedInfo if isinstance(data.distributedInfo, dict) else {}
    world = info.get("world_size")
    properties = data.deviceProperties if isinstance(data.deviceProperties, list) else []
    devices = [d for d in properties if isinstance(d, dict)]
    rank = rank_of(path, data)
    events = scan(data.traceEvents)
    records = to_records(rank or 0, events, patterns)
    measured = device_time(data.traceEvents, patterns)
    return ParsedTrace(
        path=path,
        rank=rank,
        world_size=world if isinstance(world, int) else None,
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        device_name=str(devices[0].get("name")) if devices else None,
        records=records,
        on_device=bool(events.gpu_t0),
        device_time=measured,
    )


def assign_ranks(folder: Path, parsed: list[ParsedTrace], skipped: list[str]) -> list[ParsedTrace]:
    """The usable traces by rank. Unreadable files are skipped with a note; InputError when
    none is left, when ranks cannot be told, or when two files claim one rank."""
    usable = []
    for trace in parsed:
        if trace.error:
            skipped.append(f"{trace.error} (file skipped)")
        else:
            usable.append(trace)
    unknown = [t for t in usable if t.rank is None]
    known = [t for t in usable if t.rank is not None]
    if unknown and (known or len(unknown) > 1):
        raise InputError(
            folder,
            "cannot tell the rank of " + ", ".join(t.path.name for t in unknown)
            + " (no distributedInfo and no rank number in the name); rename them rank<N>.json",
        )  # fmt: skip
    if unknown:  # a single trace without any rank: rank 0 of its own
        skipped.append(f"{unknown[0].path}: no distributedInfo and no rank in the name "
                       "(taken as rank 0)")  # fmt: skip
        unknown[0].rank = 0
        known = unknown
    if not known:
        raise InputError(folder, "no readable Kineto trace in the folder")
    by_rank: dict[int, list[str]] = {}
    for trace in known:
        by_rank.setdefault(int(trace.rank or 0), []).append(trace.path.name)
    twice = {rank: names for rank, names in by_rank.items() if len(names) > 1}
    if twice:
        listed = "; ".join(f"rank {r}: {', '.join(n)}" for r, n in sorted(twice.items()))
        raise InputError(folder, f"several trace files claim one rank ({listed})")
    return sorted(known, key=lambda t: int(t.rank or 0))
