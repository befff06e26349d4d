"""A trace's collectives as they cross from the worker that parsed it: packed columns, not
one dict each (issue 43: the dicts were most of a large trace folder's memory in the
gathering process, about 650 bytes a collective, and they were pickled there).

What the gathering process still needs of each collective, besides its table row:
- its process group's ranks (`group_ranks`), to name the group by its axis once the layout
  is known (`named_by_axis`): kept as one code per row into the file's few distinct
  rank lists (`PackedComms.members`);
- `peer` and `seq`, the two comm columns only a trace gives: int64 values and a null mask;
- what the layout's inference counts (`layout.infer_layout` and `placement` read, per
  collective, its group's ranks and name, op, rank, step, whether it starts in its step's
  first quarter, whether its op came from a kernel's name, its peer and its bytes):
  those fields counted per distinct value (`LayoutRows`), which `LayoutView` hands to
  `infer_layout` as the same collectives again, one shared dict per distinct value repeated
  as often as it occurred, so the inference counts exactly what it counted from the records,
  in memory that grows with the distinct values (a few per step and rank), not the records.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.contract.limits import MAX_WORLD_SIZE
from diag.rankfile.rank_file import KEPT_COLUMNS
from diag.rankfile.records import Encoded, Packed, pack, unpack
from diag.read.kineto.batches import KERNEL_KEY, RESUME_KEY, split_batches
from diag.read.kineto.grid_placement import PlacementMarks, marks
from diag.read.kineto.placement import name_by_placement, starts_early

COMM = "comm"
MESSAGE_COLUMNS = ("peer", "seq")
"""Comm columns only a trace gives (not in the rank files' format): a message's other side
(global rank) and each record's place in its process group's order (comm_ops.py)."""
BATCH_COLUMNS = (KERNEL_KEY, RESUME_KEY)
"""What a batched kernel's ops carry until their split (batches.py): the kernel's index on its
rank and when the rank's computation resumed after it; not columns of the table."""

LayoutKey = tuple[Any, ...]
"""(group's ranks or None, group name, op, rank, step, t0 as the inference reads it, from_name,
peer, bytes, blocking)"""


@dataclass
class LayoutRows:
    """The distinct `LayoutKey`s of a trace and how often each occurred, as columns: a field
    whose values are all ints as an int64 array, any other as codes into its distinct values.
    A rank has a few distinct keys a step, so the gathering process holds these for every
    rank and step until the layout is inferred: about 80 bytes a key here, against about 250
    as a tuple counted in a Counter."""

    columns: list[np.ndarray]  # per field, int64 values or int32 codes
    labels: list[list[Any] | None]  # per field, its distinct values (None: the values as ints)
    counts: np.ndarray

    @classmethod
    def of(cls, counted: Counter[LayoutKey]) -> LayoutRows:
        keys = list(counted)
        columns: list[np.ndarray] = []
        labels: list[list[Any] | None] = []
        for values in zip(*keys, strict=True) if keys else [()] * len(LAYOUT_FIELDS):
            if all(type(v) is int and -(2**63) <= v < 2**63 for v in values):
                columns.append(np.array(values, dtype=np.int64))
                labels.append(None)
                continue
            distinct: dict[Any, int] = {}
            codes = [distinct.setdefault(v, len(distinct)) for v in values]
            columns.append(np.array(codes, dtype=np.int32))
            labels.append(list(distinct))
        return cls(columns, labels, np.fromiter(counted.values(), np.int64, len(keys)))

    def __len__(self) -> int:
        return len(self.counts)

    def items(self) -> Iterator[tuple[LayoutKey, int]]:
        fields = [
            column.tolist() if found is None else list(map(found.__getitem__, column.tolist()))
            for column, found in zip(self.columns, self.labels, strict=True)
        ]
        yield from zip(zip(*fields, strict=True), self.counts.tolist(), strict=True)


LAYOUT_FIELDS = (
    "group_ranks", "group", "op", "rank", "step", "t0", "from_name", "peer", "bytes", "blocking",
    "alone", "ahead",
)  # fmt: skip
"""The fields of a `LayoutKey`, in order (the keys of the dicts `LayoutView` hands on)."""


@dataclass
class Message:
    """An integer column that may be null: values (0 where null) and the null mask."""

    values: np.ndarray
    null: np.ndarray


@dataclass
class PackedComms:
    """One trace's collectives, packed (the module's docstring says what and why)."""

    columns: dict[str, Packed]
    members: list[tuple[int, ...] | None]  # the distinct group rank lists (None: unknown)
    member_codes: np.ndarray  # per row, its index into `members`
    messages: dict[str, Message | list[Any]]  # peer, seq (a list where they are not ints)
    layout_rows: LayoutRows | Counter[LayoutKey] = field(default_factory=Counter)
    marks: PlacementMarks = field(default_factory=PlacementMarks)
    """Where no op names its group: what grid_placement.py reads of the trace."""

    def __len__(self) -> int:
        return len(self.member_codes)

    @property
    def ranks_named(self) -> int:
        """How many ranks the trace's collectives show the job has at least: one more than the
        highest rank a group lists, or the largest group's size where that is more (a trace
        that gives sizes without ranks); 0 where they say nothing."""
        highest = max((max(m) for m in self.members if m), default=-1)
        sizes = self.columns.get("group_size")
        values = sizes.values if isinstance(sizes, Encoded) else [] if sizes is None else sizes
        sized = [int(v) for v in values if type(v) is int and 0 < v <= MAX_WORLD_SIZE]
        return max(highest + 1, *sized, 0)


def pack_comms(comms: list[dict[str, Any]], steps: list[dict[str, Any]]) -> PackedComms:
    """A trace's comm records (converted, named by the trace) packed, with what the layout's
    inference counts of them; `steps`: the same trace's step records (their windows)."""
    fields = {name: [comm.get(name) for comm in comms] for name in _FIELDS_READ}
    layout_rows = _layout_rows(comms, fields, steps)
    distinct: dict[tuple[int, ...] | None, int] = {}
    member_codes = np.fromiter(
        (distinct.setdefault(ranks, len(distinct)) for ranks in fields["group_ranks"]),
        np.int32, count=len(comms),
    )  # fmt: skip
    plain: dict[str, list[Any]] = {name: fields[name] for name in KEPT_COLUMNS[COMM]}
    try:
        columns = pack({COMM: dict(plain)})[COMM]
    except (TypeError, ValueError, OverflowError):  # a value of an unexpected type: as is
        columns = dict(plain)
    messages = {name: _message(fields[name]) for name in (*MESSAGE_COLUMNS, *BATCH_COLUMNS)}
    return PackedComms(
        columns, list(distinct), member_codes, messages, LayoutRows.of(layout_rows),
        marks(comms, steps),
    )  # fmt: skip


_FIELDS_READ = tuple(
    dict.fromkeys((*KEPT_COLUMNS[COMM], *MESSAGE_COLUMNS, *BATCH_COLUMNS, "group_ranks",
                   "from_name"))
)  # fmt: skip
"""The records' fields that packing reads, each read once into a column."""


def _message(values: list[Any]) -> Message | list[Any]:
    null = np.array([v is None for v in values], dtype=bool)
    try:
        numbers = np.array([0 if v is None else v for v in values], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return values
    if not all(type(v) is int for v in values if v is not None):  # floats, bools: as written
        return values
    return Message(numbers, null)


def _layout_rows(
    comms: list[dict[str, Any]], fields: dict[str, list[Any]], steps: list[dict[str, Any]]
) -> Counter[LayoutKey]:
    """What `layout._families` and `infer_layout` read of each collective (`fields`: the
    records' columns), counted per distinct value. The start is kept only as the inference
    reads it: the step window's start when the collective starts in its first quarter
    (FORWARD_SHARE), the window's end when not, so that the inference's test gives the same
    answer from the same step windows (the trace's own step records, the last of a repeated
    step, as its `windows` keeps)."""
    windows = {(s["rank"], s["step"]): (s["t0"], s["t1"]) for s in steps}
    ranks, numbers = [c["rank"] for c in comms], [c["step"] for c in comms]
    read_starts = []
    for start, window in zip(
        fields["t0"], map(windows.get, zip(ranks, numbers, strict=True)), strict=True
    ):  # fmt: skip
        t0, t1 = window or (0, 0)
        read_starts.append(t0 if starts_early(start, t0, t1) else t1)
    alone, ahead = lone_messages(comms), gathers_ahead(comms)
    everyone = range(len(comms))
    return Counter(
        zip(
            fields["group_ranks"], fields["group"], fields["op"], ranks, numbers, read_starts,
            map(bool, fields["from_name"]), fields["peer"], fields["bytes"],
            fields["blocking"], map(alone.get, everyone), map(ahead.get, everyone),
            strict=True,
        )
    )  # fmt: skip


def gathers_ahead(comms: list[dict[str, Any]]) -> dict[int, bool]:
    """For each all-gather (by index into `comms`), whether it started before the first
    reduction (all-reduce or reduce-scatter) of its rank, step and group, or in a rank-step
    with none: parameters gathered before any gradient exists (ZeRO-3 / FSDP's forward;
    sharding.py). Read here, where the times are; the layout's counts keep only the flag."""
    first: dict[tuple[Any, ...], int] = {}
    for comm in comms:
        if comm.get("op") in ("all_reduce", "reduce_scatter"):
            key = (comm["rank"], comm["step"], comm.get("group_ranks"), comm.get("group"))
            t0 = int(comm["t0"])
            first[key] = min(first.get(key, t0), t0)
    out: dict[int, bool] = {}
    for i, comm in enumerate(comms):
        if comm.get("op") == "all_gather":
            key = (comm["rank"], comm["step"], comm.get("group_ranks"), comm.get("group"))
            reduced = first.get(key)
            out[i] = reduced is None or int(comm["t0"]) < reduced
    return out


EXCHANGE_NS = 50_000
"""A send and a receive of one rank starting this close swap messages (batched together)."""


def lone_messages(comms: list[dict[str, Any]]) -> dict[int, bool]:
    """For each send and receive in a group of two (by index into `comms`), whether no
    message of the other kind of the same rank, step and group starts within EXCHANGE_NS of
    it: ring attention's rounds swap messages (none alone), a two-stage pipeline's first
    stage sends its first activations alone (`layout.Family.exchanges`). Read here, where
    the times are; the layout's counts keep only the flag."""
    starts: dict[tuple[Any, ...], tuple[list[int], list[int]]] = {}
    pairs: list[tuple[int, tuple[Any, ...], bool]] = []
    for i, comm in enumerate(comms):
        op, members = comm.get("op"), comm.get("group_ranks")
        if op not in ("send", "recv") or not members or len(members) != 2:
            continue
        key = (comm["rank"], comm["step"], members)
        sends, receives = starts.setdefault(key, ([], []))
        (sends if op == "send" else receives).append(int(comm["t0"]))
        pairs.append((i, key, op == "send"))
    for sends, receives in starts.values():
        sends.sort()
        receives.sort()
    out: dict[int, bool] = {}
    for i, key, is_send in pairs:
        sends, receives = starts[key]
        other = receives if is_send else sends
        t0 = int(comms[i]["t0"])
        j = bisect.bisect_left(other, t0 - EXCHANGE_NS)
        out[i] = j == len(other) or other[j] > t0 + EXCHANGE_NS
    return out


class LayoutView:
    """The collectives of some traces as `infer_layout` reads them (its `comms`): each distinct
    `LayoutKey` as one dict, repeated as often as it occurred. Iterable any number of times;
    nothing reads the dicts' other fields, and nothing changes them. The dicts are made as
    they are read, one at a time: held together, one per distinct value of every trace, they
    grew with the folder's ranks and steps (about 3 KB a rank and step)."""

    def __init__(self, parts: list[LayoutRows | Counter[LayoutKey]]) -> None:
        self.parts = parts

    @property
    def rows(self) -> Iterable[tuple[dict[str, Any], int]]:
        """Each distinct collective once, with how often it occurred (made as they are read:
        the layout's tallies and the schedule count them once per distinct value); iterable
        any number of times, so a reader that passes over them twice makes them twice rather
        than holding them (the schedule's reader held every one: 1.4 GiB for a moment on a
        64-rank, 7,000-step folder)."""
        return _DistinctRows(self.parts)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for part in self.parts:
            for key, count in part.items():
                row = _row(key)
                for _ in range(count):
                    yield row


class _DistinctRows:
    """`LayoutView.rows`: each distinct collective as a dict, with its count, made as read."""

    def __init__(self, parts: list[LayoutRows | Counter[LayoutKey]]) -> None:
        self.parts = parts

    def __iter__(self) -> Iterator[tuple[dict[str, Any], int]]:
        for part in self.parts:
            for key, count in part.items():
                yield _row(key), count


def _row(key: LayoutKey) -> dict[str, Any]:
    """A `LayoutKey` as the dict of its LAYOUT_FIELDS (a display: twice as fast as
    `dict(zip(LAYOUT_FIELDS, key))`, and the gathering process makes one per distinct key and
    reader, about a million on the 1.1 GB class)."""
    group_ranks, group, op, rank, step, t0, from_name, peer, size, blocking, alone, ahead = key
    return {"group_ranks": group_ranks, "group": group, "op": op, "rank": rank, "step": step,
            "t0": t0, "from_name": from_name, "peer": peer, "bytes": size, "blocking": blocking,
            "alone": alone, "ahead": ahead}  # fmt: skip


def named_by_axis(part: PackedComms, axis_of: dict[tuple[int, ...], str]) -> dict[str, Packed]:
    """The part's columns with each collective whose group's ranks are one of the manifest's
    groups (`axis_of`: sorted ranks -> axis) named by that axis; the others keep the trace's
    name (`kineto.manifest.axis_of`, on codes: one lookup per distinct rank list)."""
    named = [axis_of.get(m) if m else None for m in part.members]
    if not any(name is not None for name in named):
        return part.columns
    group = part.columns["group"]
    labels, codes = (
        (group.values, group.codes) if isinstance(group, Encoded) else _encoded(list(group))
    )
    if labels is None:  # unhashable labels: row by row
        values = list(group)
        renamed = [named[m] if named[m] is not None else v
                   for m, v in zip(part.member_codes.tolist(), values, strict=True)]  # fmt: skip
        return {**part.columns, "group": renamed}
    pairs = part.member_codes.astype(np.int64) * max(len(labels), 1) + codes
    distinct, inverse = np.unique(pairs, return_inverse=True)
    new_labels = [
        named[int(pair) // max(len(labels), 1)]
        if named[int(pair) // max(len(labels), 1)] is not None
        else labels[int(pair) % max(len(labels), 1)]
        for pair in distinct.tolist()
    ]
    merged: dict[Any, int] = {}
    remap = np.fromiter((merged.setdefault(v, len(merged)) for v in new_labels), np.int32,
                        count=len(new_labels))  # fmt: skip
    return {**part.columns, "group": Encoded(list(merged), remap[inverse].astype(np.int32))}


def named_by_placement(
    parts: list[PackedComms], columns: list[dict[str, Packed]], layout: schema.Layout
) -> list[dict[str, Packed]]:
    """The columns with each op no group names (an older trace's) named by the axis its kind
    and size say in the given layout (`placement.name_by_placement`, on light rows of the
    fields it reads, made only where some op has neither a group nor its ranks)."""
    if not any(m is None for part in parts for m in part.members):
        return columns
    rows = []
    for part, table in zip(parts, columns, strict=True):
        fields = {name: _listed(table[name]) for name in ("op", "bytes", "rank", "group")}
        members = [part.members[code] for code in part.member_codes.tolist()]
        rows.append([
            {"op": op, "bytes": size, "rank": rank, "group": group, "group_ranks": ranks}
            for op, size, rank, group, ranks in zip(
                fields["op"], fields["bytes"], fields["rank"], fields["group"], members,
                strict=True,
            )
        ])  # fmt: skip
    name_by_placement([row for part in rows for row in part], [], layout)
    return [
        {**table, "group": [row["group"] for row in part]}
        for table, part in zip(columns, rows, strict=True)
    ]


def split_packed_batches(
    parts: list[PackedComms],
    columns: list[dict[str, Packed]],
    stand_ins: dict[tuple[int, int], tuple[int, int]] | None = None,
) -> list[dict[str, Packed]]:
    """The columns with each op of a batched point-to-point kernel given its own end and wait
    from its peer's op (`batches.split_batches`, on light rows of the sends and receives that
    name a peer and the batched ops: the others are not read), made only where some kernel
    ran several ops. `stand_ins`: the links standing for an untraced rank's
    (`peers.stand_in_links`)."""
    if not any(_has_values(part.messages[KERNEL_KEY]) for part in parts):
        return columns
    picked: list[tuple[int, list[int]]] = []
    rows: list[dict[str, Any]] = []
    for index, (part, table) in enumerate(zip(parts, columns, strict=True)):
        kernel = _values(part.messages[KERNEL_KEY])
        peer = _values(part.messages["peer"])
        ops = _listed(table["op"])
        keep = [
            i for i, op in enumerate(ops)
            if kernel[i] is not None or (op in ("send", "recv") and peer[i] is not None)
        ]  # fmt: skip
        if not keep:
            continue
        named = ("rank", "step", "group", "t0", "t1", "async", "blocking", "bytes")
        fields = {name: _listed(table[name]) for name in named}
        resume = _values(part.messages[RESUME_KEY])
        picked.append((index, keep))
        rows += [
            {**{name: values[i] for name, values in fields.items()}, "op": ops[i],
             "peer": peer[i], KERNEL_KEY: kernel[i], RESUME_KEY: resume[i]}
            for i in keep
        ]  # fmt: skip
    if not split_batches(rows, stand_ins):
        return columns
    out = list(columns)
    at = 0
    for index, keep in picked:
        table = dict(columns[index])
        changed = {name: _listed(table[name]) for name in ("t1", "async", "blocking")}
        for i, row in zip(keep, rows[at : at + len(keep)], strict=True):
            for name, values in changed.items():
                values[i] = row[name]
        at += len(keep)
        table["t1"] = np.asarray(changed["t1"], dtype=np.int64)
        table["async"], table["blocking"] = changed["async"], changed["blocking"]
        out[index] = table
    return out


def _has_values(column: Message | list[Any]) -> bool:
    if isinstance(column, Message):
        return bool((~column.null).any())
    return any(v is not None for v in column)


def _values(column: Message | list[Any]) -> list[Any]:
    """A message column as a list, None where null."""
    if isinstance(column, Message):
        return [None if n else v for v, n in zip(column.values.tolist(), column.null.tolist(),
                                                  strict=True)]  # fmt: skip
    return list(column)


def _listed(values: Packed) -> list[Any]:
    """A packed column as a plain list, NaN read as null (a size the trace does not give)."""
    column = unpack([values])
    listed = column.tolist() if isinstance(column, np.ndarray) else list(column)
    return [None if isinstance(v, float) and v != v else v for v in listed]


def _encoded(values: list[Any]) -> tuple[list[Any] | None, np.ndarray]:
    try:
        distinct = dict.fromkeys(values)
    except TypeError:
        return None, np.zeros(0, dtype=np.int64)
    code = {value: i for i, value in enumerate(distinct)}
    return list(distinct), np.fromiter(map(code.__getitem__, values), np.int64, len(values))


def message_column(parts: list[PackedComms], name: str, rows: int) -> Any:
    """`peer` or `seq` of the gathered comm table (`rows` long): Int64, null where unknown."""
    found = [part.messages[name] for part in parts]
    if sum(len(part) for part in parts) != rows:
        return pd.NA
    if all(isinstance(m, Message) for m in found):
        messages = [m for m in found if isinstance(m, Message)]
        if not messages:
            return pd.array([], dtype="Int64")
        return pd.arrays.IntegerArray(
            np.concatenate([m.values for m in messages]),
            np.concatenate([m.null for m in messages]),
        )
    values: list[Any] = []
    for m in found:
        values += (
            [None if n else v for v, n in zip(m.values.tolist(), m.null.tolist(), strict=True)]
            if isinstance(m, Message) else m
        )  # fmt: skip
    return pd.array(values, dtype="Int64")
