"""The run directory format: the one module that `collectors` (writer) and `diag` (reader) share.

A run directory holds `manifest.json` (written by rank 0 at start, replaced atomically at the end)
and one `rank-NNNNN.jsonl` per rank (one JSON object per line, flushed at least once per step).
See docs/run-format.md for every field. Standard library only: the collectors import this module
inside training processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeGuard

from diag.contract.files import read_regular
from diag.contract.limits import MAX_INTEGER, MAX_LABEL_CHARS, MAX_MANIFEST_BYTES, MAX_WORLD_SIZE

RUN_SCHEMA = "diag.run/1"
REPORT_SCHEMA = "diag.report/1"
MANIFEST_FILE = "manifest.json"
TRACES_DIR = "traces"
RANK_FILE_RE = re.compile(r"^rank-(\d{5,})\.(jsonl|arrows)$")
"""A rank file: JSON lines (`.jsonl`) or an Arrow IPC stream (`.arrows`,
diag/rankfile/arrow_format.py)."""


RANK_FILE_SUFFIX = ".jsonl"
"""The JSON-lines rank files' suffix (the Arrow ones': diag/rankfile/arrow_format.py, `.arrows`)."""


def rank_file_name(rank: int, suffix: str = RANK_FILE_SUFFIX) -> str:
    """A rank's file name (`suffix`: `.jsonl`, or the Arrow files' `.arrows`)."""
    return f"rank-{rank:05d}{suffix}"


class RecordKind(StrEnum):
    STEP = "step"
    SPAN = "span"
    COMM = "comm"
    MEM = "mem"
    EXPERTS = "experts"
    EVENT = "event"


class Phase(StrEnum):
    FWD = "fwd"
    BWD = "bwd"
    OPT = "opt"
    DATA = "data"
    COMM_WAIT = "comm_wait"
    KERNEL = "kernel"  # a GPU computation kernel or a CPU operator (from a profiler trace)
    MEMCPY = "memcpy"  # a GPU memory copy or set (from a profiler trace)


COMPUTE_PHASES = frozenset({
    Phase.FWD.value, Phase.BWD.value, Phase.OPT.value, Phase.DATA.value, Phase.KERNEL.value,
    Phase.MEMCPY.value,
})  # fmt: skip


class CollectiveOp(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    SEND = "send"
    RECV = "recv"
    BARRIER = "barrier"


class MemoryCategory(StrEnum):
    PARAMS = "params"
    GRADS = "grads"
    OPTIMIZER = "optimizer"
    ACTIVATIONS = "activations"
    COMM_BUFFERS = "comm_buffers"
    FRAGMENTATION = "fragmentation"


MEMORY_CATEGORIES: tuple[str, ...] = tuple(c.value for c in MemoryCategory)


class RunStatus(StrEnum):
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    UNKNOWN = "unknown"
    """An input that does not say (a folder of Flight Recorder dumps): never written by a run;
    the status the analysis derives from the data (`summary.status`) is the one shown."""


TRAINERS = ("dp", "tp", "pp", "ep", "zero3", "lightning", "hf", "custom")

# Fields every record of a kind carries (others are optional; readers ignore unknown fields).
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    RecordKind.STEP.value: ("step", "t0", "t1"),
    RecordKind.SPAN.value: ("step", "phase", "t0", "t1"),
    RecordKind.COMM.value: ("step", "op", "group", "group_size", "bytes", "t0", "t1"),
    RecordKind.MEM.value: ("step", *MEMORY_CATEGORIES),
    RecordKind.EXPERTS.value: ("step", "layer", "tokens"),
    RecordKind.EVENT.value: ("step", "name"),
}


class SchemaError(ValueError):
    """A manifest or record that does not follow this format; the message names the reason."""


@dataclass
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    zero_stage: int = 0
    microbatches: int = 1
    """Per step per pipeline. 0 (and 0 virtual stages) in a layout given to read a trace
    folder (`--layout` without `m=`): not given, read from the traces where they say it."""
    schedule: str | None = None
    virtual_stages: int = 1
    grad_accum: int = 1
    bucket_mb: float | None = None


@dataclass
class ModelInfo:
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq_len: int | None = None
    micro_batch: int | None = None
    vocab: int | None = None
    ffn_hidden: int | None = None
    experts: int | None = None
    topk: int | None = None
    capacity_factor: float | None = None
    aux_loss_coef: float | None = None
    params: int | None = None
    dtype: str | None = None
    attention: str | None = None


@dataclass
class RankInfo:
    rank: int
    host: str | None = None
    local_rank: int | None = None
    device_name: str | None = None
    machine: str | None = None
    """The real host name (`host` may be a virtual node, `gpus_per_node`): ranks on one machine
    share its cores."""
    usable_cores: int | None = None
    """The cores this rank's process may run on (its affinity mask), when recorded."""


@dataclass
class Hardware:
    gpus_per_node: int | None = None
    device_memory_bytes: int | None = None
    intra_node_GBps: float | None = None
    inter_node_GBps: float | None = None


UNKNOWN_LAYOUT = "unknown"
"""How a manifest's `layout_source` starts where the layout could not be read."""
SCHEDULE_READ = "schedule read: "
"""What a trace folder's `layout_source` says, after `; `, where its pipeline's micro-batches
and virtual stages were read from the traces (`schedule read: m=8, v=1 (<evidence>)`)."""
SCHEDULE_UNKNOWN = "schedule unknown: "
"""... and where they could not be (`schedule unknown: <reason>`)."""
ZERO_UNKNOWN = "ZeRO stage unknown: "
"""What a trace folder's `layout_source` says, after `; `, where its data-parallel
collectives do not say the ZeRO stage (`ZeRO stage unknown: <reason>`; read: `ZeRO-3 read:
<evidence>`)."""
NOT_GIVEN_ZERO = -1
"""A `--layout` without `zero=`: the stage is read from the traces where they say it."""


@dataclass
class Manifest:
    run_id: str
    created: str
    world_size: int
    trainer: str = "custom"
    command: str | None = None
    backend: str | None = None
    device_type: str | None = None
    layout: Layout = field(default_factory=Layout)
    model: ModelInfo = field(default_factory=ModelInfo)
    ranks: list[RankInfo] = field(default_factory=list)
    groups: dict[str, list[list[int]]] = field(default_factory=dict)
    hardware: Hardware = field(default_factory=Hardware)
    injections: list[str] = field(default_factory=list)
    status: str = RunStatus.RUNNING.value
    steps_completed: int | None = None
    schema: str = RUN_SCHEMA
    layout_source: str | None = None
    """Where the layout came from when diag read it (a profiler trace folder, Flight Recorder
    dumps): `given`, `from the traces' process groups (...)`, `inferred: <reason>` or `unknown:
    <reason>` (the layout is then one rank per axis, a placeholder); None in a run's own
    manifest."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def layout_unknown(self) -> bool:
        """Whether diag could not read the layout (a trace folder's `layout_source` `unknown:
        <reason>`): its groups and every rank's role are unknown, and what compares a rank
        with its peers or matches collectives by group claims nothing."""
        return (self.layout_source or "").startswith(UNKNOWN_LAYOUT)

    @property
    def schedule_known(self) -> bool:
        """Whether the layout's micro-batches and virtual stages are known: a run's own
        manifest or a layout given by hand says them, and a trace folder's where they were
        read from its pipeline's sends and receives (`SCHEDULE_READ`,
        diag/read/kineto/schedule.py); else the schedule's theory bubble is unknown."""
        source = self.layout_source
        if source is None or f"; {SCHEDULE_READ}" in source:
            return True
        return source.split(";")[0] == "given" and SCHEDULE_UNKNOWN not in source

    @property
    def zero_known(self) -> bool:
        """Whether the ZeRO stage is known: a run's own manifest or a layout given by hand
        says it, a trace folder's where its data-parallel collectives say it
        (diag/read/kineto/sharding.py; `ZERO_UNKNOWN` in the source where they do not)."""
        source = self.layout_source
        return source is None or not (self.layout_unknown or f"; {ZERO_UNKNOWN}" in source)

    @property
    def accumulation_known(self) -> bool:
        """Whether the gradient accumulation is known: a trace folder says it only where it
        was given (0 otherwise: no collective shows it in every framework alike)."""
        return self.layout_source is None or self.layout.grad_accum >= 1

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Parse a manifest, ignoring unknown fields; raises SchemaError with the reason. Known
        fields must hold their declared types, ranks (in `ranks` and `groups`) must be in the
        world, and counts within diag/contract/limits.py's bounds."""
        if not isinstance(data, dict):
            raise SchemaError("manifest is not a JSON object")
        schema = data.get("schema")
        if schema != RUN_SCHEMA:
            raise SchemaError(f"schema is {shown(schema)}, expected {RUN_SCHEMA!r}")
        world_size = data.get("world_size")
        if not _is_int(world_size) or world_size < 1:
            raise SchemaError(f"world_size is {shown(world_size)}, expected a positive integer")
        if world_size > MAX_WORLD_SIZE:
            raise SchemaError(
                f"world_size is {world_size}, above the limit of {MAX_WORLD_SIZE:,} ranks"
            )
        try:
            manifest = cls(
                run_id=str(data.get("run_id") or ""),
                created=str(data.get("created") or ""),
                world_size=world_size,
                trainer=str(data.get("trainer") or "custom"),
                command=data.get("command"),
                backend=data.get("backend"),
                device_type=data.get("device_type"),
                layout=known_fields(Layout, data.get("layout")),
                model=known_fields(ModelInfo, data.get("model")),
                ranks=[known_fields(RankInfo, r) for r in data.get("ranks") or []],
                groups=_groups(data.get("groups"), world_size),
                hardware=known_fields(Hardware, data.get("hardware")),
                injections=[str(s) for s in data.get("injections") or []],
                status=str(data.get("status") or RunStatus.RUNNING.value),
                steps_completed=data.get("steps_completed"),
                layout_source=source[:MAX_LABEL_CHARS]
                if isinstance(source := data.get("layout_source"), str)
                else None,
            )
        except (TypeError, ValueError) as err:
            raise SchemaError(f"malformed field: {err}") from err
        except RecursionError:
            raise SchemaError("malformed field: nested too deeply") from None
        sections = {"": manifest, "layout.": manifest.layout, "model.": manifest.model,
                    "hardware.": manifest.hardware}  # fmt: skip
        for section, part in sections.items():
            _check_scalars(section, part)
        for i, info in enumerate(manifest.ranks):
            _check_scalars(f"ranks[{i}].", info)
            if not 0 <= info.rank < world_size:
                raise SchemaError(
                    f"ranks[{i}].rank is {info.rank}, outside the world of {world_size} ranks"
                )
        return manifest


def known_fields(cls: Any, data: Any) -> Any:
    """Build a dataclass from the fields of `data` it knows (unknown fields are ignored)."""
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise SchemaError(f"{cls.__name__.lower()} is not a JSON object")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _groups(data: Any, world_size: int) -> dict[str, list[list[int]]]:
    """The manifest's groups by name, every rank an integer of the world."""
    if not data:
        return {}
    if not isinstance(data, dict):
        raise SchemaError("malformed field: groups is not a JSON object")
    groups = {}
    for name, members in data.items():
        if not isinstance(members, list) or not all(isinstance(g, list) for g in members):
            raise SchemaError(f"malformed field: groups.{name} is not a list of rank lists")
        for group in members:
            for rank in group:
                if not _is_int(rank) or not 0 <= rank < world_size:
                    raise SchemaError(
                        f"malformed field: groups.{name} holds rank {shown(rank)}, outside "
                        f"the world of {world_size} ranks"
                    )
        groups[str(name)] = [list(group) for group in members]
    return groups


_SCALARS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,)}


def _check_scalars(section: str, part: Any) -> None:
    """Each scalar field of a manifest dataclass holds its declared type or null where the
    type allows it; a whole float stands for an int (and becomes one); integers stay within
    MAX_INTEGER. Raises SchemaError naming the field."""
    for spec in dataclasses.fields(part):
        value = getattr(part, spec.name)
        kinds = str(spec.type).split(" | ")
        allowed = tuple(t for kind in kinds for t in _SCALARS.get(kind, ()))
        if not allowed or (value is None and "None" in kinds):
            continue
        if "int" in kinds and isinstance(value, float) and value.is_integer():
            value = int(value)
            setattr(part, spec.name, value)
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise SchemaError(f"{section}{spec.name} is {shown(value)}, expected {spec.type}")
        if isinstance(value, int) and abs(value) > MAX_INTEGER:
            raise SchemaError(f"{section}{spec.name} is {value}, beyond the limit of 2**62")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: Any, limit: int = 40) -> str:
    """A value as a message quotes it: its repr, cut to `limit` characters; a JSON array or
    object by its kind (never printed whole: it may be huge or deeply nested)."""
    if isinstance(value, list | tuple):
        return "a JSON array"
    if isinstance(value, dict):
        return "a JSON object"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write manifest.json atomically (temp file + rename), so readers never see half of one."""
    path = Path(run_dir) / MANIFEST_FILE
    tmp = path.with_name(f".{MANIFEST_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    """Read and validate manifest.json; raises OSError, UnicodeDecodeError, or SchemaError
    naming the reason."""
    path = Path(run_dir) / MANIFEST_FILE
    text = read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SchemaError(f"not valid JSON ({err.msg} at line {err.lineno})") from err
    except RecursionError:
        raise SchemaError("not valid JSON (nested too deeply to parse)") from None
    except ValueError:  # an integer of more digits than Python converts
        raise SchemaError("not valid JSON (a number too long to convert)") from None
    if _SURROGATE_ESCAPE.search(text):
        data = without_lone_surrogates(data)
    return Manifest.from_dict(data)


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""A code point JSON's `\\uD800` escapes can name but no Unicode text holds: it cannot be
written as UTF-8 (pyarrow, a terminal), so what reads input replaces or refuses it."""
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def without_lone_surrogates(data: Any) -> Any:
    """Parsed JSON with each lone surrogate of its strings replaced by U+FFFD (shown as such:
    a host name stays recognisable). Nesting too deep to copy is returned as it is (the
    schema refuses it)."""
    try:
        text = json.dumps(data, ensure_ascii=False)
    except (RecursionError, ValueError):
        return data
    return json.loads(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))


def check_record(record: Any) -> str | None:
    """Return the reason a record cannot be used, or None. Unknown kinds are usable (ignored)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    kind = record.get("kind")
    if not isinstance(kind, str):
        return "no 'kind' field"
    missing = [f for f in REQUIRED_FIELDS.get(kind, ()) if f not in record]
    if missing:
        return f"{kind} record without {', '.join(missing)}"
    return None
