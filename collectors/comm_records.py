"""A rank's collectives as records (docs/run-format.md, `comm` and `comm_issued`): each process
group's name (`register_group`, or `world` / `other` by its size), its size and global ranks
(asked of torch.distributed once per group), each collective's `seq` (1, 2, ... per group, in
the order this rank issued them) and the group's ranks on its first record. The Recorder
(collectors/recorder.py) writes what this builds; torch.distributed is read, never changed."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from collectors.comm import CommEvent
from diag.contract.names import WORLD


class GroupRecords:
    """The names, sizes and sequence counts of one rank's process groups."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.names: dict[int, tuple[str, Any]] = {}  # id(group) -> (name, group: kept alive)
        self.seq: dict[int, int] = {}  # group key -> collectives issued on it so far
        self.info: dict[int, tuple[int, list[int] | None]] = {}  # key -> size, ranks
        self.announced: set[int] = set()  # groups whose ranks a comm record gave already

    def register(self, name: str, group: Any) -> None:
        self.names[id(group)] = (name, group)

    def is_named(self, group: Any) -> bool:
        return id(group) in self.names

    def name(self, group: Any) -> str:
        entry = self.names.get(id(group))
        if entry is not None:
            return entry[0]
        if group is None or group is getattr(dist.GroupMember, "WORLD", None):
            return WORLD
        return WORLD if dist.get_world_size(group) == self.world_size else "other"

    def group(self, group: Any) -> tuple[int, int, list[int] | None]:
        """(key, size, global ranks or None) of a process group; the key counts its `seq`."""
        world = getattr(dist.GroupMember, "WORLD", None)
        key = -1 if group is None or group is world else id(group)
        info = self.info.get(key)
        if info is None:
            if dist.is_initialized():
                pg = world if key == -1 else group
                info = (dist.get_world_size(pg), list(dist.get_process_group_ranks(pg)))
            else:
                info = (1, None)
            self.info[key] = info
        return key, info[0], info[1]

    def number(self, e: CommEvent, key: int) -> None:
        """Give `e` its `seq` on its group, once (issued and completed alike)."""
        if e.seq is None:
            e.seq = self.seq[key] = self.seq.get(key, 0) + 1

    def issued_fields(self, e: CommEvent) -> dict[str, Any]:
        """The `comm_issued` event's fields of a collective about to be launched."""
        key, size, ranks = self.group(e.group)
        self.number(e, key)
        fields: dict[str, Any] = {
            "op": e.op, "group": self.name(e.group), "group_size": size,
            "group_ranks": ranks, "seq": e.seq, "bytes": e.bytes, "dtype": e.dtype, "tag": e.tag,
        }  # fmt: skip
        if e.peer is not None:
            fields["peer"] = e.peer
        return fields

    def comm_record(self, e: CommEvent, step: int) -> dict[str, Any]:
        """The `comm` record of a completed collective of step `step`."""
        key, group_size, ranks = self.group(e.group)
        self.number(e, key)
        record = {
            **(e.fields or {}),
            "kind": "comm",
            "step": step,
            "op": e.op,
            "group": self.name(e.group),
            "group_size": group_size,
            "bytes": e.bytes,
            "dtype": e.dtype,
            "t0": e.t0,
            "t1": e.t1,
            "expected_bytes": e.expected_bytes,
            "tag": e.tag,
            "async": e.is_async,
            "blocking": e.blocking,
            "seq": e.seq,
        }
        if e.peer is not None:
            record["peer"] = e.peer
        if key not in self.announced:  # the group's members, on its first record
            self.announced.add(key)
            record["group_ranks"] = ranks
        return record
