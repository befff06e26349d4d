"""A folder of Kineto traces (`torch.profiler` + `tensorboard_trace_handler`): one
`*.json` / `*.json.gz` file per rank. Which rank a file holds comes from its `distributedInfo`,
else from a number in its name (`rank3`, `rank-3`, `rank_3`); a file with neither, or two files
claiming one rank, is an error that lists the files (trace_ranks.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from diag.contract.limits import (
    MAX_LABEL_CHARS,
    MAX_TRACE_EVENT_BYTES,
    MAX_WHOLE_TRACE_BYTES,
    MAX_WORLD_SIZE,
)
from diag.contract.names import WORLD
from diag.errors import InputError
from diag.rankfile.record_checks import is_int
from diag.read.kineto import one_pass
from diag.read.kineto.convert import PROFILER_RANGE_SKIPPED, RankEvents, Scan, to_records
from diag.read.kineto.device import DeviceScan, DeviceTime
from diag.read.kineto.events import (
    ABSENT,
    DECODE_ERRORS,
    DECODER,
    FAST,
    KEPT_DECODER,
    Args,
    Kept,
    KeptTrace,
    Trace,
    event_from,
    kept_from,
)
from diag.read.kineto.kernels import KernelPatterns
from diag.read.kineto.scanned import ScannedBatch
from diag.read.kineto.scanned_take import take_scanned
from diag.read.kineto.stream import NotStreamable, inflated, stream_events

try:
    from msgspec.structs import astuple as struct_tuple
except ImportError:  # pragma: no cover - without msgspec no trace is streamed (SharedArgs)
    struct_tuple = None  # type: ignore[assignment]

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)
T = TypeVar("T")


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
    notes: list[str] = dataclasses.field(default_factory=list)  # what was left out, and why
    # distributedInfo.pg_config: each group this rank belongs to, (sorted ranks, its name)
    pg_groups: list[tuple[tuple[int, ...], str]] = dataclasses.field(default_factory=list)
    # calls to the device's runtime in a trace without device events (a GPU job profiled
    # without ProfilerActivity.CUDA): its work as read is the host's (`host_only_note`)
    launches_without_device: int = 0
    profiler_ranges: int = 0  # CUPTI range profiler events: counters, not a timeline
    other_devices: tuple[str, ...] = ()  # a device not CUDA's whose events it holds (mtia)
    numbered: bool = True  # its steps are ProfilerStep numbers (False: no ProfilerStep, step 0)


def read_trace(path: Path) -> tuple[Trace, list[str]]:
    """The trace's events with every argument, its metadata, and notes on what was left out
    of them; InputError naming the file on a truncated, invalid or oversized one. Typed
    decoding first; a trace it refuses (an event that is not an object, a top level of
    another shape) is parsed as plain JSON and its objects kept."""
    return _read_whole(path, DECODER if FAST else None, Trace, event_from)


def read_events(path: Path) -> tuple[KeptTrace, list[str]]:
    """`read_trace` with only what the analysis reads of each event (events.Kept)."""
    return _read_whole(path, KEPT_DECODER if FAST else None, KeptTrace, kept_from)


def _read_whole(
    path: Path, decoder: Any, trace: Callable[..., T], event: Callable[[Any], Any]
) -> tuple[T, list[str]]:
    """The file read and parsed whole: by `decoder` (msgspec) when it accepts it, else by the
    standard parser, each JSON object made an event by `event`."""
    raw = _inflate(path)
    if decoder is not None:
        try:
            return decoder.decode(raw), []
        except DECODE_ERRORS:
            pass  # NaN and other things the standard parser accepts, or the reason it gives
        except RecursionError:
            raise InputError(path, "not valid JSON: nested too deeply to parse") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise InputError(path, f"not valid JSON: {err.msg} at line {err.lineno}") from None
    except UnicodeDecodeError as err:
        raise InputError(path, f"not UTF-8 text ({err.reason})") from None
    except RecursionError:
        raise InputError(path, "not valid JSON: nested too deeply to parse") from None
    except ValueError:  # an integer of more digits than Python converts
        raise InputError(path, "not valid JSON: a number too long to convert") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(path, "not a Kineto trace (no traceEvents list)")
    events = [e for e in map(event, data["traceEvents"]) if e is not None]
    notes = []
    if dropped := len(data["traceEvents"]) - len(events):
        notes.append(f"{path}: {dropped} events skipped (not JSON objects)")
    found = trace(
        traceEvents=events,
        distributedInfo=data.get("distributedInfo"),
        deviceProperties=data.get("deviceProperties"),
    )
    return found, notes


def _inflate(path: Path) -> bytearray:
    """A trace's text, inflated a chunk at a time when compressed (within diag/contract/limits.py's
    bound on gzip: a gzip bomb is never inflated into memory), refused as soon as it passes
    MAX_WHOLE_TRACE_BYTES: read whole, the parsed events hold several times their text."""
    out = bytearray()
    for chunk in inflated(path):
        out += chunk
        if len(out) > MAX_WHOLE_TRACE_BYTES:
            raise InputError(
                path,
                f"over the {MAX_WHOLE_TRACE_BYTES // 2**20} MiB a trace read whole may be (it "
                f"does not read as a stream: an event or the text before the events over "
                f"{MAX_TRACE_EVENT_BYTES // 2**20} MiB, or a shape the streaming reader does not "
                "take)",
            )
    return out


def rank_of(path: Path, data: Trace | KeptTrace) -> int | None:
    info = data.distributedInfo
    if isinstance(info, dict) and is_int(info.get("rank")):
        return int(info["rank"])
    found = _RANK_IN_NAME.search(path.name)
    return int(found.group(1)) if found else None


def parse_file(path: Path, patterns: KernelPatterns) -> ParsedTrace:
    """Read one trace and convert its events to records; errors are kept, not raised."""
    try:
        data, events, measured, notes = _scanned(path, patterns)
        rank, world = _rank_and_world(path, data)
    except InputError as error:
        return ParsedTrace(path, None, None, None, None, {}, error=str(error))
    info: dict[str, Any] = data.distributedInfo if isinstance(data.distributedInfo, dict) else {}
    properties = data.deviceProperties if isinstance(data.deviceProperties, list) else []
    devices = [d for d in properties if isinstance(d, dict)]
    records = to_records(rank or 0, events, patterns)
    groups = pg_groups(info.get("pg_config"), world)
    _ranks_by_group_name(records["comm"], groups)
    _name_the_only_group(records["comm"], info, world)
    notes += [f"{path}: {n} events skipped ({why})" for why, n in sorted(events.skipped.items())]
    if events.gpu_t0 and (measured is None or not events.launches):
        # said, and not measured: without launches every idle gap reads as no one's, the
        # host's share as 0
        measured = None
        why = (
            "no CUDA runtime events in the trace"
            if not events.launches
            else "none before its last step"
        )
        notes.append(
            f"{path}: {len(events.gpu_t0):,} device events but none of their launches ({why}): "
            "the device's idle time is not split into waiting for the host and waiting on a "
            "dependency, and its device-time breakdown (HST002, HST003) is not measured"
        )
    if not events.steps and (records["step"] or records["span"]):
        # said, not assumed: the window may hold many iterations, and its time is no step's
        notes.append(
            f"{path}: no ProfilerStep#N annotation (the profiler's step() not called in the "
            "window): the whole window is read as one step, step 0, however many iterations it "
            "holds; its step time is the window's"
        )
    if by_name := events.comm_sources.get("its name (no launch found)"):
        notes.append(
            f"{path}: {by_name} communication kernels whose launch is not in the trace (begun "
            "before it): their op read from the kernel's name, no group or peer"
        )
    return ParsedTrace(
        path=path,
        rank=rank,
        world_size=world,
        backend=_text(info.get("backend")),
        device_name=_text(devices[0].get("name")) if devices else None,
        records=records,
        on_device=bool(events.gpu_t0),
        device_time=measured,
        notes=notes,
        pg_groups=[(ranks, names[0]) for ranks, names in groups],
        launches_without_device=0 if events.gpu_t0 else len(events.launches),
        profiler_ranges=events.skipped.get(PROFILER_RANGE_SKIPPED, 0),
        other_devices=tuple(sorted(events.other_devices)),
        numbered=bool(events.steps),
    )


def _scanned(
    path: Path, patterns: KernelPatterns
) -> tuple[KeptTrace, RankEvents, DeviceTime | None, list[str]]:
    """The trace's metadata, what the converter and the device time take of its events, and
    notes. Read a batch of events at a time as the file inflates (stream.py); a file that is
    not read so is read whole, which gives the same events, or the error. Either way the
    events are taken by one loop (one_pass.take)."""
    if FAST:
        scanned, measured = Scan(), DeviceScan()

        share = SharedArgs()

        def take(batch: list[Kept]) -> None:
            one_pass.take(batch, scanned, measured, share.one)

        def take_columns(batch: ScannedBatch) -> None:
            take_scanned(batch, scanned, measured, share.one)

        try:
            data = stream_events(path, take, take_columns)
            return data, scanned.result(), measured.result(patterns), []
        except NotStreamable:
            pass
    data, notes = read_events(path)
    scanned, measured = Scan(), DeviceScan()
    # the whole file's events at once, their argument sets as decoded (SharedArgs keys them
    # by msgspec, which a file read without it lacks; sharing changes nothing read)
    one_pass.take(data.traceEvents, scanned, measured, _as_decoded)
    return data, scanned.result(), measured.result(patterns), notes


def _as_decoded(args: Args) -> Args:
    return args


MAX_SHARED_ARGS = 65_536
"""Distinct argument sets `SharedArgs` keeps (more: the rest kept as decoded)."""


class SharedArgs:
    """Equal argument sets of a trace's events as one object. The converter keeps the
    arguments of every `record_param_comms` and `nccl:<op>` annotation until the trace is
    read (comm_ops.py), and a rank repeats a few sets every step: decoded, each is its own
    struct and strings (about 600 bytes; 40% of a worker's memory on the simulated 1.1 GB
    folder). A set with a correlation id (a launch's, a kernel's) is its event's own and is
    left as is; so is one holding a list (not hashable). Nothing changes an event's
    arguments after decoding, so sharing them changes nothing read."""

    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], Args] = {}
        self.values: dict[tuple[type, Any], Any] = {}

    def one(self, args: Args) -> Args:
        """`args` as the set kept for its values (one_pass.py asks only for the sets the
        converter keeps)."""
        if args.correlation is not ABSENT:
            return self._values_shared(args)
        key = struct_tuple(args)
        try:
            found = self.seen.get(key)
        except TypeError:  # a list among them
            return args
        if found is not None:
            return found
        if len(self.seen) < MAX_SHARED_ARGS:
            self.seen[key] = args
        return args

    def _values_shared(self, args: Args) -> Args:
        """A set of its event's own (a kernel's: its correlation id) with its repeated values
        (the op's name, dtype, sizes, group) as the objects equal ones are already kept as:
        newer Kineto copies the collective's arguments onto every communication kernel, each
        decoded into its own strings (about 400 bytes a kernel; a quarter of a worker's
        memory on communication-heavy traces). A value's type is part of its key (1, 1.0
        and True are equal keys); at most MAX_SHARED_ARGS values are kept (a hostile trace's
        distinct values are not), others left as decoded."""
        values = self.values
        for name in REPEATED_ARGS:
            value = getattr(args, name)
            kind = type(value)
            if kind is str or kind is int:
                found = values.get((kind, value))
                if found is None:
                    if len(values) < MAX_SHARED_ARGS:
                        values[(kind, value)] = value
                elif found is not value:
                    setattr(args, name, found)
        return args


REPEATED_ARGS = ("collective", "dtype", "in_nelems", "out_nelems", "group_size", "group_name",
                 "group_desc", "group_ranks", "rank_start", "rank_stride", "src", "dst",
                 "input_type")  # fmt: skip
"""An event's own argument set's fields that repeat across its events (not its correlation,
stream or sequence number, each the event's own or a small int)."""


def _name_the_only_group(
    comms: list[dict[str, Any]], info: dict[str, Any], world: int | None
) -> None:
    """Collectives whose group the trace does not say (gloo's worker events carry no
    arguments) are in the job's process group when `distributedInfo.pg_config` lists only one:
    `world` when it spans the world size, else its description."""
    configs = info.get("pg_config")
    unnamed = [c for c in comms if c["group"] is None]
    if not unnamed or not isinstance(configs, list) or len(configs) != 1:
        return
    (config,) = configs
    if not isinstance(config, dict):
        return
    size = config.get("pg_size")
    size = size if is_int(size) and 0 < size <= MAX_WORLD_SIZE else None
    spans_world = size is not None and size == world
    name = WORLD if spans_world else _text(config.get("pg_desc")) or _text(config.get("pg_name"))
    for comm in unnamed:  # group_size stays unknown with the bytes: no bandwidth from 0 bytes
        comm["group"] = name


MAX_PG_CONFIGS = 1024
"""Entries of a trace's pg_config read (more: the rest ignored)."""


def pg_groups(configs: Any, world: int | None) -> list[tuple[tuple[int, ...], tuple[str, str]]]:
    """(sorted global ranks, (its name, `pg<pg_name>`)) of each process group that
    `distributedInfo.pg_config` lists: a list of {pg_name, pg_desc, pg_size or group_size,
    ranks}, or a dict of them by name; empty `ranks` with the world's size is the world
    (PyTorch writes it so). The names are those a collective's record carries (its
    description, else `pg<Process Group Name>`). Entries that are not that shape, or name ranks
    outside the world, are skipped."""
    entries = list(configs.values()) if isinstance(configs, dict) else configs
    if not isinstance(entries, list):
        return []
    out = []
    for entry in entries[:MAX_PG_CONFIGS]:
        if not isinstance(entry, dict):
            continue
        size = entry.get("pg_size", entry.get("group_size"))
        ranks = entry.get("ranks")
        if isinstance(ranks, list) and not ranks and world and size == world:
            ranks = list(range(world))
        if not isinstance(ranks, list) or not 0 < len(ranks) <= MAX_WORLD_SIZE:
            continue
        if not all(is_int(r) and 0 <= r < (world or MAX_WORLD_SIZE) for r in ranks):
            continue
        number = _text(entry.get("pg_name"))
        names = (_text(entry.get("pg_desc")) or "", f"pg{number}" if number else "")
        out.append((tuple(sorted(set(ranks))), names))
    return out


def _ranks_by_group_name(
    comms: list[dict[str, Any]], groups: list[tuple[tuple[int, ...], tuple[str, str]]]
) -> None:
    """A collective whose record names its group but lists no ranks (PyTorch before 2.4 writes
    `Process Group Name/Description` without `Process Group Ranks`) gets the ranks of the
    pg_config entry of that name, where only one entry of this rank's has it."""
    by_name: dict[str, tuple[int, ...] | None] = {}
    for ranks, names in groups:
        for name in names:
            if name and name != "undefined":
                by_name[name] = None if name in by_name else ranks  # two groups: ambiguous
    if not by_name:
        return
    for comm in comms:
        if not comm.get("group_ranks") and comm.get("group") in by_name:
            comm["group_ranks"] = by_name[comm["group"]]


def _rank_and_world(path: Path, data: Trace | KeptTrace) -> tuple[int | None, int | None]:
    """The trace's rank and its distributedInfo world size (None when it does not say); InputError
    when either is outside diag/contract/limits.py's world."""
    rank = rank_of(path, data)
    if rank is not None and not 0 <= rank < MAX_WORLD_SIZE:
        raise InputError(path, f"rank {rank} (distributedInfo or the file name) is outside "
                               f"0..{MAX_WORLD_SIZE - 1}")  # fmt: skip
    info = data.distributedInfo if isinstance(data.distributedInfo, dict) else {}
    world = info.get("world_size")
    if not is_int(world):
        return rank, None
    if not 1 <= world <= MAX_WORLD_SIZE:
        raise InputError(path, f"distributedInfo world_size {world} is outside 1..{MAX_WORLD_SIZE}")
    return rank, world


def _text(value: Any) -> str | None:
    """A name from the trace's metadata: a string, cut to MAX_LABEL_CHARS; None otherwise."""
    return value[:MAX_LABEL_CHARS] if isinstance(value, str) else None
