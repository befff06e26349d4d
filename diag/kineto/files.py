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

from diag.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)


@dataclass(frozen=True)
class TraceFile:
    path: Path
    rank: int
    world_size: int | None  # from distributedInfo
    backend: str | None
    groups: list[dict[str, Any]]  # distributedInfo.pg_config
    events: list[dict[str, Any]]
    device_properties: list[dict[str, Any]]


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


def read_trace(path: Path) -> dict[str, Any]:
    """The parsed JSON object; InputError naming the file on a truncated or invalid one."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (EOFError, gzip.BadGzipFile) as err:
        raise InputError(path, f"truncated or corrupt gzip ({err})") from None
    except json.JSONDecodeError as err:
        raise InputError(path, f"not valid JSON: {err.msg} at line {err.lineno}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, f"cannot read ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(path, "not a Kineto trace (no traceEvents list)")
    return data


def rank_of(path: Path, data: dict[str, Any]) -> int | None:
    info = data.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    found = _RANK_IN_NAME.search(path.name)
    return int(found.group(1)) if found else None


def load_files(folder: Path, skipped: list[str]) -> list[TraceFile]:
    """Every readable trace of the folder with its rank. Unreadable files are skipped with a
    note; InputError when none is left, or when ranks are missing or claimed twice."""
    paths = trace_files(folder)
    if not paths:
        raise InputError(folder, "no Kineto trace files (*.json, *.json.gz) in the folder")
    loaded: list[TraceFile] = []
    unknown: list[str] = []
    for path in paths:
        try:
            data = read_trace(path)
        except InputError as error:
            skipped.append(f"{error} (file skipped)")
            continue
        rank = rank_of(path, data)
        if rank is None:
            unknown.append(path.name)
            continue
        info: dict[str, Any] = (
            data["distributedInfo"] if isinstance(data.get("distributedInfo"), dict) else {}
        )
        loaded.append(
            TraceFile(
                path=path,
                rank=rank,
                world_size=info.get("world_size")
                if isinstance(info.get("world_size"), int)
                else None,
                backend=info.get("backend"),
                groups=[g for g in info.get("pg_config") or [] if isinstance(g, dict)],
                events=data["traceEvents"],
                device_properties=[
                    d for d in data.get("deviceProperties") or [] if isinstance(d, dict)
                ],
            )
        )
    if unknown and (loaded or len(unknown) > 1):
        raise InputError(
            folder,
            "cannot tell the rank of " + ", ".join(unknown)
            + " (no distributedInfo and no rank number in the name); rename them rank<N>.json",
        )  # fmt: skip
    if unknown:  # a single trace without any rank: rank 0 of its own
        path = folder / unknown[0]
        data = read_trace(path)
        skipped.append(f"{path}: no distributedInfo and no rank in the name (taken as rank 0)")
        loaded.append(TraceFile(path, 0, None, None, [], data["traceEvents"], []))
    if not loaded:
        raise InputError(folder, "no readable Kineto trace in the folder")
    by_rank: dict[int, list[str]] = {}
    for trace in loaded:
        by_rank.setdefault(trace.rank, []).append(trace.path.name)
    twice = {rank: names for rank, names in by_rank.items() if len(names) > 1}
    if twice:
        listed = "; ".join(f"rank {r}: {', '.join(n)}" for r, n in sorted(twice.items()))
        raise InputError(folder, f"several trace files claim one rank ({listed})")
    return sorted(loaded, key=lambda t: t.rank)
