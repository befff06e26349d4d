"""Cases for the pipeline family: bubble against theory, m < 4p, stage imbalance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rule_cases import RuleCase


def _pp(runs: Any, pp: int, m: int, busy_ms: list[float], step_ms: float = 100) -> Path:
    """One rank per stage, 4 steps of `step_ms`: stage s computes `busy_ms[s]` per step (its
    fwd spans carry the stage) and idles the rest."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for stage, busy in enumerate(busy_ms):
        rows: list[dict[str, Any] | str] = []
        for step in range(4):
            t0 = step * step_ms
            rows += [runs.step(step, t0, t0 + step_ms),
                     runs.span(step, "fwd", t0, t0 + busy, stage=stage, chunk=0)]  # fmt: skip
        ranks[stage] = rows
    manifest = runs.manifest(
        world_size=pp,
        layout={"dp": 1, "pp": pp, "microbatches": m, "schedule": "1f1b"},
        groups={"pp": [list(range(pp))]},
    )
    return runs.write(ranks, manifest)


def _linked(runs: Any, busy_ms: list[float], m: int = 8) -> Path:
    """Two stages linked by their messages, 4 steps: stage 0 computes busy_ms[0], sends its
    activations and waits for the gradients; stage 1 waits for the activations, computes
    busy_ms[1] and sends the gradients back (the step is as long as both)."""
    b0, b1 = busy_ms
    first: list[dict[str, Any] | str] = []
    second: list[dict[str, Any] | str] = []
    flags = {"async": True, "blocking": False}
    blocking = {"async": False, "blocking": True}
    t0 = 0.0
    for step in range(4):
        sent, back, end = t0 + b0, t0 + b0 + 0.1 + b1, t0 + b0 + b1 + 0.3
        first += [
            runs.span(step, "fwd", t0, sent, stage=0, chunk=0),
            runs.comm(step, sent, sent + 0.1, op="send", group="pp", tag="act", **flags),
            runs.comm(step, sent + 0.1, back + 0.1, op="recv", group="pp", tag="grad", **blocking),
            runs.step(step, t0, end),
        ]
        second += [
            runs.comm(step, t0, sent + 0.1, op="recv", group="pp", tag="act", **blocking),
            runs.span(step, "fwd", sent + 0.1, back, stage=1, chunk=0),
            runs.comm(step, back, back + 0.1, op="send", group="pp", tag="grad", **flags),
            runs.step(step, t0, end),
        ]
        t0 = end + 0.5
    manifest = runs.manifest(
        world_size=2,
        layout={"dp": 1, "pp": 2, "microbatches": m, "schedule": "1f1b"},
        groups={"pp": [[0, 1]]},
    )
    return runs.write({0: first, 1: second}, manifest)


CASES = [
    RuleCase("PIP001", True, lambda runs: _pp(runs, 2, 8, [40, 40]),
             "bubble 0.6 measured against 0.11 in theory (p=2, m=8)", severity="medium"),
    RuleCase("PIP001", False, lambda runs: _pp(runs, 2, 8, [85, 85]),
             "bubble 0.15 measured against 0.11 in theory"),
    RuleCase("PIP002", True, lambda runs: _pp(runs, 4, 2, [40, 40, 40, 40]),
             "p=4, m=2: 60% bubble in theory, m < 4p", severity="high"),
    RuleCase("PIP002", False, lambda runs: _pp(runs, 2, 8, [85, 85]),
             "p=2, m=8 = 4p"),
    RuleCase("PIP003", True, lambda runs: _linked(runs, [40, 90]),
             "stage 1 computes 90 ms against 40 ms", severity="medium", ranks=(1,)),
    RuleCase("PIP003", False, lambda runs: _pp(runs, 2, 8, [85, 88]),
             "stages within 4%"),
]  # fmt: skip
