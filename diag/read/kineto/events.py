"""The fields of a Kineto trace the analysis reads, decoded straight into slotted structs.

msgspec decodes only these fields (everything else in the JSON is skipped, its values never
built): several times as fast as the standard parser on a large trace, in a fraction of its
memory. Of an event's `args` the analysis keeps only the keys it reads (`Args`); a key the
trace does not write is `ABSENT` there, told apart from a JSON null. Field types are left open
(`Any`): a trace that writes an odd type gets it as written, and the readers check. `Event`
keeps the whole `args` object, for callers that want every argument (`files.read_trace`).

Without msgspec (an environment that lacks it) the same classes are plain objects and every
trace is read by the standard library's parser (`FAST` is False; `from_json_object`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar

try:
    import msgspec
except ImportError:  # pragma: no cover - the standard library reads the traces then
    msgspec = None  # type: ignore[assignment]

FAST = msgspec is not None
"""msgspec decodes the traces (else the standard library's parser, slower and larger)."""


class _Absent:
    """A key the trace does not write (msgspec.UNSET's stand-in without msgspec)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


class _PlainStruct:
    """msgspec.Struct's stand-in without msgspec: a keyword constructor over the fields, each
    defaulting to its class attribute."""

    __struct_fields__: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **_options: Any) -> None:
        cls.__struct_fields__ = tuple(inspect.get_annotations(cls))

    def __init__(self, **values: Any) -> None:
        for name in self.__struct_fields__:
            setattr(self, name, values.get(name, getattr(type(self), name, None)))


if TYPE_CHECKING or FAST:
    from msgspec import UNSET as ABSENT
    from msgspec import Struct
else:
    ABSENT = _Absent()
    Struct = _PlainStruct


def _key(name: str) -> Any:
    """A field read from the JSON key `name`, ABSENT when the trace does not write it."""
    return msgspec.field(default=ABSENT, name=name) if FAST else ABSENT


ARG_KEYS = {
    "correlation": "correlation", "stream": "stream", "collective": "Collective name",
    "dtype": "dtype", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems",
    "group_size": "Group size", "group_name": "Process Group Name",
    "group_desc": "Process Group Description", "group_ranks": "Process Group Ranks",
    "rank_start": "Global rank start", "rank_stride": "Global rank stride", "src": "Src Rank",
    "dst": "Dst Rank", "seq": "Seq", "input_dims": "Input Dims", "input_type": "Input type",
}  # fmt: skip
"""The `args` the analysis reads: Args' field -> the key Kineto writes."""


class Args(Struct, gc=False):
    """The arguments of an event the analysis reads (no cycles: not tracked by the collector)."""

    correlation: Any = ABSENT
    stream: Any = ABSENT
    collective: Any = _key("Collective name")  # record_param_comms: the collective's name
    dtype: Any = ABSENT
    in_nelems: Any = _key("In msg nelems")
    out_nelems: Any = _key("Out msg nelems")
    group_size: Any = _key("Group size")
    group_name: Any = _key("Process Group Name")
    group_desc: Any = _key("Process Group Description")
    group_ranks: Any = _key("Process Group Ranks")
    rank_start: Any = _key("Global rank start")  # a strided group's first global rank
    rank_stride: Any = _key("Global rank stride")
    src: Any = _key("Src Rank")  # a receive's sender (global rank; PyTorch 2.4 on)
    dst: Any = _key("Dst Rank")  # a send's receiver
    seq: Any = _key("Seq")  # the collective's sequence number in its process group
    input_dims: Any = _key("Input Dims")  # `nccl:<op>` annotations of older traces: the shapes
    input_type: Any = _key("Input type")  # ... and the element types, for the bytes


class Kept(Struct, gc=False):
    """An event as the analysis reads it."""

    ph: Any = None
    cat: Any = None
    name: Any = ""
    ts: Any = None
    dur: Any = None
    tid: Any = None
    args: Args | None = None  # None: the trace writes none


class Event(Struct):
    """An event with every argument (`args`: the JSON object as written)."""

    ph: Any = None
    cat: Any = None
    name: Any = ""
    ts: Any = None
    dur: Any = None
    tid: Any = None
    args: Any = None


class Trace(Struct):
    traceEvents: list[Event]
    distributedInfo: Any = None
    deviceProperties: Any = None


class KeptTrace(Struct):
    """A trace as the analysis reads it (`stream.py` decodes its events apart, and then the
    rest of the document here: the metadata and an empty events list)."""

    traceEvents: list[Kept]
    distributedInfo: Any = None
    deviceProperties: Any = None


DECODER: Any = None
KEPT_DECODER: Any = None
BATCH_DECODER: Any = None
ARGS_DECODER: Any = None
if FAST:
    DECODER = msgspec.json.Decoder(Trace)
    KEPT_DECODER = msgspec.json.Decoder(KeptTrace)
    BATCH_DECODER = msgspec.json.Decoder(list[Kept])
    ARGS_DECODER = msgspec.json.Decoder(list[Args])  # events' `args` alone (scanned.py)
    DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.ValidationError, msgspec.DecodeError)
else:
    DECODE_ERRORS = ()


def event_from(value: Any) -> Event | None:
    """An Event from a decoded JSON object (the slow path for traces the typed decoder refuses);
    None for anything that is not an object."""
    if not isinstance(value, dict):
        return None
    return Event(**{k: value[k] for k in Event.__struct_fields__ if k in value})


def kept_from(value: Any) -> Kept | None:
    """A Kept event from a decoded JSON object (the standard library's path); None for anything
    that is not an object. `args` other than an object count as none."""
    if not isinstance(value, dict):
        return None
    fields = {k: value[k] for k in Kept.__struct_fields__ if k in value}
    args = value.get("args")
    fields["args"] = (
        Args(**{field: args[key] for field, key in ARG_KEYS.items() if key in args})
        if isinstance(args, dict)
        else None
    )
    return Kept(**fields)
