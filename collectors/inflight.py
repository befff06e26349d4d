"""What one rank has open right now: the step, its spans, the collectives it issued and that have
not completed; and when it last made progress. Written at every flush as `step_open`,
`span_open` and `comm_issued` events (docs/run-format.md), so a rank stuck inside `fwd` of step
6, or inside all-reduce #41 of `dp`, says so in its rank file while it is stuck.

The training thread (and the communication threads that complete collectives) change it; the
watchdog thread reads it. No lock: every change is one dict store or pop, or one attribute
store, each atomic under the GIL, and the reader copies the dicts' values in one C call
(`list(d.values())`), so neither side ever waits for the other.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

from collectors.comm import CommEvent

STEP_HISTORY = 32
"""How many recent step durations the stall threshold's median is taken over."""


class InFlight:
    def __init__(self) -> None:
        self.step_t0: int | None = None  # the open step's start (ns), None between steps
        self.step_index = 0  # the open step's index (the last opened one between steps)
        self.fetch_t0: int | None = None  # a `rec.iterate` fetch in progress: its start
        self.spans: dict[int, dict[str, Any]] = {}  # id(span context) -> its record
        self.comms: dict[int, tuple[int, CommEvent, dict[str, Any]]] = {}
        """id(event) -> (step it was issued in, the event, its comm_issued fields)."""
        self.flushed_ns = 0  # when the writer last flushed (the watchdog's heartbeat counts)
        self.progress_ns = 0  # the last step/span/comm start or end (a heartbeat is not one)
        self.step_ns: deque[int] = deque(maxlen=STEP_HISTORY)  # recent completed step durations
        self.closed = False

    @property
    def active(self) -> bool:
        """Whether the rank is inside a step or a fetch: where a long silence means a stall."""
        return not self.closed and (self.step_t0 is not None or self.fetch_t0 is not None)

    def median_step_s(self) -> float | None:
        durations = list(self.step_ns)
        return statistics.median(durations) / 1e9 if durations else None

    def open_records(self) -> list[dict[str, Any]]:
        """The `step_open`, `span_open` and `comm_issued` events of what is open now."""
        records: list[dict[str, Any]] = []
        step_t0 = self.step_t0
        if step_t0 is not None:
            records.append(_event("step_open", self.step_index, t0=step_t0))
        for span in list(self.spans.values()):
            records.append(
                _event("span_open", span["step"], phase=span["phase"], mb=span["mb"],
                       stage=span["stage"], chunk=span["chunk"], t0=span["t0"])
            )  # fmt: skip
        for step, comm, fields in list(self.comms.values()):
            records.append(_event("comm_issued", step, t0=comm.t0, **fields))
        return records

    def any_open(self) -> bool:
        return self.step_t0 is not None or bool(self.spans) or bool(self.comms)


def _event(name: str, step: int, **fields: Any) -> dict[str, Any]:
    return {"kind": "event", "step": step, "name": name, **fields}
