"""A run builder shared by the trend, MoE, memory and pitfall cases."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Rows = list[dict[str, Any] | str]


def state_run(
    runs: Any,
    walls_ms: Sequence[float] = (100.0,) * 4,
    ranks: int = 2,
    extra: Callable[[int, int], Rows] | None = None,
    **manifest: Any,
) -> Path:
    """`ranks` ranks with one fwd span per step of the given walls; `extra(rank, step)` adds
    records to each step; `manifest` fields go to `runs.manifest`."""
    records: dict[int, Rows] = {}
    for rank in range(ranks):
        rows: Rows = []
        t0 = 0.0
        for step, wall in enumerate(walls_ms):
            rows += [runs.span(step, "fwd", t0, t0 + wall), runs.step(step, t0, t0 + wall)]
            rows += extra(rank, step) if extra else []
            t0 += wall
        records[rank] = rows
    return runs.write(records, runs.manifest(world_size=ranks, **manifest))


def event(step: int, name: str, **fields: Any) -> dict[str, Any]:
    return {"kind": "event", "step": step, "name": name, **fields}
