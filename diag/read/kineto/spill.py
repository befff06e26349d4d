"""One trace's packed records put on disk by the worker that parsed it, and read back by the
worker that reduces it (issue 43): a large folder's spans and collectives never gather in one
process.

Why: a collective's group is named by its axis before the time breakdown reads it, and the
axes are known only once every trace's collectives have been counted (layout.py). Until then
the packed columns of every trace waited in the gathering process, which grew with the folder
(about 11% of its JSON). Now the worker writes them to a private temporary folder and hands
back what the layout needs (`PackedComms.layout_rows`, the group rank lists); once the layout
is known, the traces are reduced by workers again, each reading one trace's file at a time.

The format is data only (diag reads no pickle): one `.npz` per trace, its numeric columns as
arrays (read with `allow_pickle=False`), and a JSON header naming them, with each label
dictionary and any column of plain values. A column holding a value JSON would not give back
as it was (a tuple, an object) is not spilled: `write` returns False and the trace stays in
memory, as before.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from diag.rankfile.records import Encoded, Packed
from diag.read.kineto.packed_comms import Message, PackedComms

STEP_COLUMNS = ("rank", "step", "t0", "t1")
"""What the reduction reads of a trace's step records (int64 arrays)."""


class NotSpillable(Exception):
    """A value the JSON header would not give back as it was."""


def write(
    path: Path, steps: list[dict[str, Any]], spans: dict[str, Packed], comms: PackedComms
) -> bool:
    """The trace's step columns, packed spans and packed collectives (but their layout rows)
    written to `path`; False (nothing written) when a column will not round-trip or the file
    cannot be written."""
    arrays: dict[str, np.ndarray] = {}

    def array(values: np.ndarray) -> str:
        if values.dtype.hasobject:
            raise NotSpillable
        name = f"a{len(arrays)}"
        arrays[name] = values
        return name

    def column(values: Any) -> dict[str, Any]:
        if isinstance(values, Encoded):
            return {"labels": _plain(values.values), "codes": array(np.asarray(values.codes))}
        if isinstance(values, np.ndarray):
            return {"array": array(values)}
        if isinstance(values, Message):
            return {"values": array(values.values), "null": array(values.null)}
        if isinstance(values, list):
            return {"list": _plain(values)}
        raise NotSpillable

    try:
        step_columns = {
            name: array(np.array([row[name] for row in steps], dtype=np.int64))
            for name in STEP_COLUMNS
        }
        header = {
            "steps": step_columns,
            "spans": {name: column(values) for name, values in spans.items()},
            "comms": {name: column(values) for name, values in comms.columns.items()},
            "messages": {name: column(values) for name, values in comms.messages.items()},
            "members": [None if m is None else [int(r) for r in m] for m in comms.members],
            "member_codes": array(np.asarray(comms.member_codes)),
        }
        text = json.dumps(header, allow_nan=True).encode()
    except (NotSpillable, TypeError, ValueError, OverflowError):
        return False
    arrays["header"] = np.frombuffer(text, dtype=np.uint8)
    try:
        with path.open("wb") as out:
            np.savez(out, **arrays)  # type: ignore[arg-type]
    except OSError:  # the disk full, the folder gone: the trace stays in memory
        path.unlink(missing_ok=True)
        return False
    return True


def read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Packed], PackedComms]:
    """What `write` wrote: (step columns, spans, collectives without their layout rows)."""
    with np.load(path, allow_pickle=False) as stored:
        header = json.loads(stored["header"].tobytes())

        def column(found: dict[str, Any]) -> Any:
            if "labels" in found:
                return Encoded(found["labels"], stored[found["codes"]])
            if "array" in found:
                return stored[found["array"]]
            if "null" in found:
                return Message(stored[found["values"]], stored[found["null"]])
            return found["list"]

        steps = {name: stored[key] for name, key in header["steps"].items()}
        spans = {name: column(found) for name, found in header["spans"].items()}
        comms = PackedComms(
            {name: column(found) for name, found in header["comms"].items()},
            [None if m is None else tuple(m) for m in header["members"]],
            stored[header["member_codes"]],
            {name: column(found) for name, found in header["messages"].items()},
        )
    return steps, spans, comms


def _plain(values: list[Any]) -> list[Any]:
    """`values` when JSON gives each back as it is (None, bool, int, str, a finite float or
    NaN); NotSpillable otherwise."""
    for value in values:
        kind = type(value)
        if value is None or kind is bool or kind is int or kind is str:
            continue
        if kind is float and (math.isfinite(value) or math.isnan(value)):
            continue
        raise NotSpillable
    return values
