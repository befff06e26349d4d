"""One clock per run: the host's monotonic clock, offset to wall time, aligned across hosts.

Ranks of one host read the same monotonic clock, so they are comparable as they are. Ranks on
other hosts take an offset measured when all ranks leave a start barrier; every rank of a host
takes its host leader's offset, so ranks of one host stay exactly comparable with each other.
"""

from __future__ import annotations

import time
from typing import Any


class Clock:
    def __init__(self) -> None:
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def now(self) -> int:
        return time.monotonic_ns() + self.offset_ns

    def align(self, dist: Any, physical_host: str, group: Any = None) -> int:
        """Align to rank 0's clock at a barrier; returns the correction applied (ns)."""
        dist.barrier(group=group)
        reading = (physical_host, self.now())
        readings: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(readings, reading, group=group)
        reference_ns = readings[0][1]
        leader_ns = next(t for host, t in readings if host == physical_host)
        correction = 0 if physical_host == readings[0][0] else reference_ns - leader_ns
        self.offset_ns += correction
        return correction
