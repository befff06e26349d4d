"""Cases for the communication family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rule_cases import RuleCase


def _dp2(runs: Any, comm_ms: float, group: str | None = "dp", **manifest: Any) -> Path:
    """2 DP ranks, 4 steps of 100 ms: compute, then `comm_ms` of blocking all-reduce."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(2):
        records: list[dict[str, Any] | str] = []
        for step in range(4):
            t0 = step * 100.0
            records.append(runs.step(step, t0, t0 + 100))
            records.append(runs.span(step, "fwd", t0, t0 + 100 - comm_ms))
            records.append(
                runs.comm(
                    step,
                    t0 + 100 - comm_ms,
                    t0 + 100,
                    op="all_reduce",
                    group=group,
                    group_size=2,
                    bytes=1000,
                    blocking=True,
                )
            )
        ranks[rank] = records
    return runs.write(ranks, runs.manifest(world_size=2, **manifest))


def _dp2_members_unknown(runs: Any) -> Path:
    """`_dp2` at 60% with no group on its collectives and its layout unknown (as an older
    trace folder reads): who waited for whom in them, unknown."""
    unknown = "unknown: no process groups in the traces (PyTorch before 2.2 writes none)"
    return _dp2(runs, 60, group=None, layout_source=unknown)


def _tp2(runs: Any, comm_ms: float) -> Path:
    """TP=2, 4 steps of 100 ms: compute, then `comm_ms` of per-layer TP all-reduces."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(2):
        records: list[dict[str, Any] | str] = []
        for step in range(4):
            t0 = step * 100.0
            records += [
                runs.step(step, t0, t0 + 100),
                runs.span(step, "fwd", t0, t0 + 100 - comm_ms),
                runs.comm(step, t0 + 100 - comm_ms, t0 + 100, group="tp", tag="tp.mlp.fwd"),
            ]
        ranks[rank] = records
    manifest = runs.manifest(world_size=2, layout={"dp": 1, "tp": 2})
    return runs.write(ranks, manifest)


def _dp_overlap(runs: Any, hidden: bool) -> Path:
    """2 DP ranks, 4 steps of 100 ms: fwd 0-40, bwd 40-70, an async 30 ms all-reduce either
    inside backward (hidden) or after it with a comm_wait span over it (exposed)."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(2):
        records: list[dict[str, Any] | str] = []
        for step in range(4):
            t0 = step * 100.0
            c0 = t0 + (40 if hidden else 70)
            records += [
                runs.step(step, t0, t0 + 100),
                runs.span(step, "fwd", t0, t0 + 40),
                runs.span(step, "bwd", t0 + 40, t0 + 70),
                runs.comm(step, c0, c0 + 30, tag="grad", **{"async": True}),
            ]
            if not hidden:
                records.append(runs.span(step, "comm_wait", c0, c0 + 30))
        ranks[rank] = records
    return runs.write(ranks, runs.manifest(world_size=2))


def _ledger(runs: Any, dp_ratio: float) -> Path:
    """2 ranks, 3 steps: a DP all-reduce moving `dp_ratio` x its expected bytes, and an
    expert all-to-all at 3x (left to the MoE rules)."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(2):
        records = runs.simple_rank()
        for step in range(3):
            t0 = step * 100.0
            records += [
                runs.comm(step, t0 + 60, t0 + 62, bytes=1000 * dp_ratio, expected_bytes=1000,
                          **{"async": True}),
                runs.comm(step, t0 + 10, t0 + 11, op="all_to_all", group="ep",
                          tag="dispatch", bytes=3000, expected_bytes=1000, **{"async": True}),
            ]  # fmt: skip
        ranks[rank] = records
    return runs.write(ranks, runs.manifest(world_size=2))


CASES = [
    RuleCase(
        "COM002",
        True,
        lambda runs: _tp2(runs, 60),
        "TP all-reduces take 60% of a step",
        severity="high",
    ),
    RuleCase("COM002", False, lambda runs: _tp2(runs, 10), "TP all-reduces take 10% of a step"),
    RuleCase(
        "COM003",
        True,
        lambda runs: _dp_overlap(runs, hidden=False),
        "the all-reduce starts after backward and is waited on",
        severity="medium",
    ),
    RuleCase(
        "COM003",
        False,
        lambda runs: _dp_overlap(runs, hidden=True),
        "the all-reduce runs inside backward",
    ),
    RuleCase(
        "COM004",
        True,
        lambda runs: _ledger(runs, 2.0),
        "DP all-reduce at 2x the ledger",
        severity="medium",
    ),
    RuleCase(
        "COM004",
        False,
        lambda runs: _ledger(runs, 1.1),
        "DP all-reduce within tolerance; the expert all-to-all is not this rule's",
    ),
    RuleCase(
        "COM001",
        True,
        lambda runs: _dp2(runs, 60),
        "60% of each step is blocking comm",
        severity="high",
    ),
    RuleCase("COM001", False, lambda runs: _dp2(runs, 5), "5% of each step is blocking comm"),
    RuleCase(
        "COM001",
        True,
        _dp2_members_unknown,
        "60% blocking comm, its members unknown: may be waiting, not transfer",
        severity="medium",
    ),
]
