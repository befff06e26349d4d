"""PyTorch Flight Recorder dumps, one file per rank, as one table of collective entries.

A dump is `torch._C._distributed_c10d._dump_fr_trace_json()` (JSON: read directly) or the
default `_dump_fr_trace()` pickle (read only through `diag.read.safe_pickle`, which resolves
no global: nothing in it can run). The format, as torch 2.13 writes it with gloo (version
"2.10"): `entries` (each with `pg_id`, `process_group` [name, description], `collective_seq_id`,
`p2p_seq_id`, `is_p2p`, `profiling_name` "gloo:all_reduce", `input_sizes`, `input_dtypes`,
`state`, `retired`, `time_created_ns`, ...), `pg_config` {key: {name, desc, ranks: "[0, 1]"}},
`pg_status` {pg_id: {last_enqueued_collective, last_completed_collective, ...}}; no rank (the
file's name gives it: `rank-NNNNN.json`, `rank-N.pkl`, `...rank_N`). Gloo marks no entry
`started` or `completed`: an entry is done when `retired` (its work finished and was popped)
or its state is `completed`, and open otherwise.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import pandas as pd

from diag.contract.files import read_regular
from diag.contract.limits import (
    MAX_FR_DEPTH,
    MAX_FR_DUMP_BYTES,
    MAX_FR_ENTRIES,
    MAX_FR_OBJECTS,
    MAX_LABEL_CHARS,
    MAX_WORLD_SIZE,
)
from diag.read.parallel import map_chunks
from diag.read.safe_pickle import RefusedPickle, load_plain

FR_DIR = "flight-recorder"
"""Where a run directory keeps its ranks' dumps (RUN/flight-recorder/rank-NNNNN.json)."""
FR_COLUMNS = (
    "rank", "group", "group_desc", "members", "seq", "p2p", "op", "bytes", "dtype", "sizes",
    "open", "t_created_ns", "frame", "dumped_ns", "timeout_ms",
)  # fmt: skip
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d{1,7})(?:\.(?:json|pkl|pickle))?$")
DUMP_SUFFIXES = (".json", ".pkl", ".pickle", "")
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}  # fmt: skip
_ONLY = "\0only"
"""The members of a dump's only group, whatever its entries call it."""
HOW_TO_DUMP_JSON = (
    "dump JSON instead: torch._C._distributed_c10d._dump_fr_trace_json() "
    "(or TORCH_FR_DUMP_TEMP_FILE with the JSON dumper)"
)


@dataclass
class FlightRecords:
    """The dumps of a folder: one row per entry (FR_COLUMNS), and notes on files not read."""

    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    highest_member: int = -1
    """The highest rank any entry's group names (-1: none): with `ranks`, the world's size
    the dumps show, read without going over the entries' members again."""


def dump_rank(path: Path) -> int | None:
    """The rank a dump file's name gives, or None when it names none."""
    found = _RANK_IN_NAME.search(path.name)
    if found is None:
        return None
    rank = int(found.group(1))
    return rank if rank < MAX_WORLD_SIZE else None


def dump_files(folder: Path) -> list[tuple[int, Path]]:
    """The files of `folder` whose name gives a rank, by rank (one per rank: JSON first)."""
    try:
        paths = sorted(p for p in folder.iterdir() if p.is_file())
    except OSError:
        return []
    found: dict[int, Path] = {}
    for path in sorted(paths, key=lambda p: (p.suffix != ".json", p.name)):
        rank = dump_rank(path)
        if rank is not None and path.suffix in DUMP_SUFFIXES:
            found.setdefault(rank, path)
    return sorted(found.items())


def looks_like_dump(path: Path) -> bool:
    """Cheap: a JSON file that starts like a dump's object, or a pickle's protocol byte."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    if head[:1] == b"\x80":  # a pickle of protocol 2 or later (refused if it is not plain)
        return True
    text = head.decode("utf-8", "replace")
    return text.lstrip().startswith("{") and any(
        key in text for key in ('"entries"', '"pg_config"', '"pg_status"', '"version"')
    )


def read_dumps(folder: Path) -> FlightRecords:
    """Every dump of `folder`; a file that cannot be read is noted (name and reason), not fatal.
    Read in worker processes where they are many (a 1,024-rank job's: 590 MB of JSON)."""
    rows: list[tuple] = []
    notes: list[str] = []
    ranks: list[int] = []
    highest = -1
    read = map_chunks(_read_chunk, dump_files(folder), progress="Flight Recorder dumps")
    for rank, found, said, named in (one for chunk in read for one in chunk):
        if found is not None:
            ranks.append(rank)
            rows += found
            highest = max(highest, named)
        notes += said
    notes += [f"{path}: a dump cut off while it was written (its rank ended first): not read"
              for path in partial_dumps(folder)]  # fmt: skip
    table = pd.DataFrame(rows, columns=list(FR_COLUMNS))
    return FlightRecords(table, notes, ranks, highest)


def _read_chunk(
    chunk: list[tuple[int, Path]],
) -> list[tuple[int, list[tuple] | None, list[str], int]]:
    """(rank, its rows or None when its dump could not be read, notes, the highest rank its
    entries' groups name) of each dump."""
    out: list[tuple[int, list[tuple] | None, list[str], int]] = []
    for rank, path in chunk:
        try:
            dump = read_dump(path)
        except OSError as err:
            out.append((rank, None, [f"{path}: cannot read ({err.strerror or err})"], -1))
            continue
        except ValueError as err:
            out.append((rank, None, [f"{path}: {err}"], -1))
            continue
        notes: list[str] = []
        rows, highest = dump_rows(rank, dump, notes, path)
        out.append((rank, rows, notes, highest))
    return out


def partial_dumps(folder: Path) -> list[Path]:
    """The dumps the collector began and never renamed into place (`.rank-NNNNN.json.partial`,
    collectors/watchdog.py): the rank ended while writing it."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    return [folder / name for name in names
            if name.startswith(".") and name.endswith(".partial")
            and dump_rank(Path(name[1 : -len(".partial")])) is not None]  # fmt: skip


def read_dump(path: Path) -> dict[str, Any]:
    """One dump as plain data; ValueError (the reason, one line) when it cannot be read safely."""
    # regular files only, bounded as they are read (a FIFO or a /proc file named like a dump
    # is refused, not waited on): NotReadable, an OSError, says why
    data = read_regular(path, MAX_FR_DUMP_BYTES)
    if data.lstrip()[:1] != b"{":  # not JSON: a pickle of any protocol, read without globals
        try:
            value = load_plain(data, MAX_FR_DUMP_BYTES, MAX_FR_OBJECTS, MAX_FR_DEPTH)
        except RefusedPickle as err:
            raise ValueError(f"pickled dump refused: {err}; {HOW_TO_DUMP_JSON}") from None
    else:
        # bounded before it is decoded: a hostile dump of many small values would otherwise be
        # built in full (tens of bytes of Python objects a value) before being refused
        refused = _json_bounds(data, MAX_FR_OBJECTS, MAX_FR_DEPTH)
        if refused:
            raise ValueError(f"not read: {refused}")
        try:
            value = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError("not valid JSON: not a Flight Recorder dump") from None
        except (RecursionError, ValueError):
            raise ValueError("JSON nested too deeply or a number too long: not read") from None
    if not isinstance(value, dict) or not isinstance(value.get("entries"), list):
        raise ValueError("no `entries` list: not a Flight Recorder dump")
    if len(value["entries"]) > MAX_FR_ENTRIES:
        raise ValueError(
            f"{len(value['entries']):,} entries, above the limit of {MAX_FR_ENTRIES:,}"
        )
    return value


def _json_bounds(data: bytes, max_values: int, max_depth: int) -> str | None:
    """Why a JSON text's values are too many or nest too deep (None: within both), read off
    its text outside its strings (walking the parsed values one by one took most of the time
    a 1,024-rank job's dumps took to read)."""
    # escapes out first (a backslash escapes the one character after it), so that every quote
    # left opens or closes a string
    text = np.frombuffer(data.replace(b"\\\\", b"").replace(b'\\"', b""), dtype=np.uint8)
    quote = text == ord('"')
    in_string = np.bitwise_xor.accumulate(quote.view(np.uint8)).view(bool)  # an opening quote too
    marks = text[~in_string & ~quote]
    opens = (marks == ord("[")) | (marks == ord("{"))
    closes = (marks == ord("]")) | (marks == ord("}"))
    # the values: one more than the commas of each non-empty container, at most
    if int(opens.sum()) + int((marks == ord(",")).sum()) + 1 > max_values:
        return f"more than {max_values:,} values"
    structure = opens | closes
    depth = np.cumsum(opens[structure].astype(np.int32) - closes[structure])
    if len(depth) and int(depth.max()) > max_depth:
        return f"nested deeper than {max_depth} levels"
    return None


def dump_rows(
    rank: int, dump: dict[str, Any], notes: list[str], path: Path
) -> tuple[list[tuple], int]:
    """One row per usable entry of a rank's dump (FR_COLUMNS' order), entries without a group
    or sequence skipped; and the highest rank the groups of its entries name (-1: none)."""
    members = _group_members(dump.get("pg_config"))
    # a dump holds no time of its own: its file's time is when the rank was last seen waiting
    # (what the waits of the dumps alone are measured to; a copy that drops the times says less)
    try:
        dumped_ns: int | None = path.stat().st_mtime_ns
    except OSError:
        dumped_ns = None
    # what an entry's group, op, sizes and dtypes say, by their text: a dump's entries repeat
    # a few collectives (a 1,024-rank job's 2M entries were read one by one)
    said: dict[str, tuple | None] = {}
    rows = []
    bad = 0
    for entry in dump["entries"]:
        if not isinstance(entry, dict):
            bad += 1
            continue
        p2p = entry.get("is_p2p") is True
        seq = entry.get("p2p_seq_id" if p2p else "collective_seq_id")
        shape = (entry.get("process_group"), entry.get("profiling_name"), p2p,
                 entry.get("input_sizes"), entry.get("input_dtypes"))  # fmt: skip
        key = repr(shape)  # bounded: the values nest MAX_FR_DEPTH levels at most
        if key not in said:
            said[key] = _said(*shape, members)
        static = said[key]
        if static is None or not _is_int(seq):
            bad += 1
            continue
        retired = entry.get("retired") is True
        created = entry.get("time_created_ns")
        timeout = entry.get("timeout_ms")  # its group's (its watchdog's, or gloo's wait)
        rows.append((
            rank, *static[:3], int(seq), *static[3:],
            not retired and entry.get("state") != "completed",
            int(created) if _is_int(created) and 0 <= created < 2**62 else None,
            _user_frame(entry.get("frames")),
            dumped_ns,
            int(timeout) if _is_int(timeout) and 0 < timeout < 2**40 else None,
        ))  # fmt: skip
    if bad:
        notes.append(f"{path}: {bad} entries without a group, sequence or op skipped")
    # read off the distinct shapes (a few), not the entries (a 1,024-rank job's 2M entries
    # would be 2G members)
    named = [max(said_[2]) for said_ in said.values() if said_ is not None and said_[2]]
    return rows, max(named, default=-1)


def _said(
    group: Any, name: Any, p2p: bool, sizes: Any, dtypes: Any, members: dict[str, tuple[int, ...]]
) -> tuple | None:
    """(group, group_desc, members, p2p, op, bytes, dtype, sizes) of FR_COLUMNS, or None for
    an entry without a group or op."""
    if not isinstance(group, list | tuple) or not group or not isinstance(name, str):
        return None
    name_, desc = _label(group[0]), _label(group[1] if len(group) > 1 else "")
    # one group as every rank names it: PyTorch's group name (a number), its description shown
    group_name = f"pg {name_}" + (f" ({desc})" if desc else "")
    dtype = _label(dtypes[0]) if isinstance(dtypes, list | tuple) and dtypes else None
    return (
        group_name, desc, members.get(name_) or members.get(desc) or members.get(_ONLY),
        p2p, _label(name.split(":", 1)[-1]), _bytes(sizes, dtypes), dtype, _sizes_label(sizes),
    )  # fmt: skip


def _sizes_label(sizes: Any) -> str | None:
    """The inputs' shapes as JSON writes them: a list of lists of integers (every entry's) is
    its own repr, at a fraction of `json.dumps`' time."""
    if sizes is None:
        return None
    if type(sizes) is list and all(
        type(shape) is list and all(type(dim) is int for dim in shape) for shape in sizes
    ):
        return _label(repr(sizes))
    return _label(json.dumps(sizes))


def _group_members(config: Any) -> dict[str, tuple[int, ...]]:
    """The ranks of each group of `pg_config`, by its name and by its description (the names
    PyTorch puts in an entry's `process_group`; the default group's config key may be '')."""
    found: dict[str, tuple[int, ...]] = {}
    distinct: set[tuple[int, ...]] = set()
    if not isinstance(config, dict):
        return found
    for key, group in config.items():
        if not isinstance(group, dict):
            continue
        ranks = group.get("ranks")
        if isinstance(ranks, str) and len(ranks) <= MAX_LABEL_CHARS * 64:
            try:
                ranks = json.loads(ranks)
            except ValueError:
                continue
        if not isinstance(ranks, list) or not all(_is_int(r) for r in ranks):
            continue
        if any(not 0 <= r < MAX_WORLD_SIZE for r in ranks):
            continue
        distinct.add(tuple(sorted(ranks)))
        for name in (key, group.get("name"), group.get("desc")):
            if isinstance(name, str) and name and name != _ONLY:
                found.setdefault(name[:MAX_LABEL_CHARS], tuple(sorted(ranks)))
    if len(distinct) == 1:  # gloo's default group is keyed '' in pg_config, '0' in entries
        found[_ONLY] = next(iter(distinct))
    return found


def _bytes(sizes: Any, dtypes: Any) -> int | None:
    """The bytes of an entry's inputs (elements times the dtype's size), None when unknown."""
    if not isinstance(sizes, list | tuple) or not isinstance(dtypes, list | tuple):
        return None
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        width = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        if width is None or not isinstance(shape, list | tuple):
            return None
        count = 1
        for dim in shape:
            if not _is_int(dim) or not 0 <= dim < 2**40:
                return None
            count *= dim
        total += count * width
    return total if total < 2**62 else None


def _user_frame(frames: Any) -> str | None:
    """The innermost frame outside torch's own code, as `function (file:line)` (pickled dumps
    carry the stack of the call that issued the collective; JSON dumps do not)."""
    if not isinstance(frames, list | tuple):
        return None
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename", ""))
        if "/torch/" in filename:
            continue
        return _label(f"{frame.get('name')} ({filename}:{frame.get('line')})")
    return None


def _label(value: Any) -> str:
    return str(value)[:MAX_LABEL_CHARS]


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
