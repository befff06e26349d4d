"""The ZeRO stage and the gradient accumulation of a trace folder's job: read from its
data-parallel collectives where they say it, else unknown, never a default (issue 39).

What each stage's data-parallel group carries in a step, per rank:
- ZeRO-0 (DDP): the gradients' all-reduces, nothing gathered.
- ZeRO-3 (FSDP's full sharding, DeepSpeed stage 3): every layer's parameters all-gathered
  before its forward and again before its backward, the gradients reduce-scattered once: more
  all-gathers than reductions, and the first all-gather before the first reduction.
- ZeRO-1 and ZeRO-2 (and FSDP's SHARD_GRAD_OP, Megatron's distributed optimizer): the
  gradients reduce-scattered and the parameters all-gathered once each, after the optimizer
  or overlapped with the next forward. Which of the two (whether the gradients stay sharded
  between buckets) the collectives do not say: unknown.

Gradient accumulation (optimizer steps of several forward and backward passes without a
pipeline) shows in no collective a trace records the same way in every framework: unknown
unless given (`--layout ga=N`) or read from a run's manifest beside the traces.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from diag.contract import schema
from diag.contract.names import DP
from diag.read.kineto.placement import FoundLayout, grid_size

REDUCTIONS = frozenset({"all_reduce", "reduce_scatter"})
"""The gradients' reductions a data-parallel group runs."""


@dataclasses.dataclass
class _Tally:
    """One rank-step's data-parallel collectives: counts by op, and when the first of each
    kind began."""

    ops: Counter[str] = dataclasses.field(default_factory=Counter)
    first_gather: float | None = None
    first_reduction: float | None = None
    gathered_ahead: bool = False
    """An all-gather began before the rank-step's first reduction (as the reader flags it)."""


def with_sharding(
    found: FoundLayout, given: schema.Layout | None, rows: Iterable[tuple[dict[str, Any], int]]
) -> FoundLayout:
    """The found layout with its ZeRO stage and gradient accumulation: the given ones, else
    the stage read from the data-parallel collectives (`read_zero_stage`) and the
    accumulation unknown (0, `Manifest.accumulation_known`); the source says why the stage
    is unknown where it is (`schema.ZERO_UNKNOWN`)."""
    layout = found.layout
    accumulation = given.grad_accum if given is not None else 0
    given_zero = given.zero_stage if given is not None else schema.NOT_GIVEN_ZERO
    if found.source.startswith(schema.UNKNOWN_LAYOUT):
        return _with(found, 0, accumulation, None)
    if given_zero != schema.NOT_GIVEN_ZERO:
        return _with(found, given_zero, accumulation, None)
    if (layout.dp or 1) < 2:  # nothing to shard across
        return _with(found, 0, accumulation, None)
    stage, why = read_zero_stage(rows, found.groups.get(DP), layout.dp == grid_size(layout))
    if stage is None:
        return _with(found, 0, accumulation, f"{schema.ZERO_UNKNOWN}{why}")
    return _with(found, stage, accumulation, f"ZeRO-{stage} read: {why}")


def _with(found: FoundLayout, zero: int, accumulation: int, text: str | None) -> FoundLayout:
    return found.replaced(text, zero_stage=zero, grad_accum=accumulation)


def read_zero_stage(
    rows: Iterable[tuple[dict[str, Any], int]], dp_groups: list[list[int]] | None, only_dp: bool
) -> tuple[int | None, str]:
    """The ZeRO stage (None: unknown) and why, from the collectives (`rows`: each distinct one
    with how often it occurred) of the data-parallel groups `dp_groups`; `only_dp`: data
    parallel is the job's only axis, so every collective of a group of more than one rank is
    its (older traces name no group's ranks). Every rank-step with data-parallel collectives
    must say the same stage."""
    members = {tuple(sorted(g)) for g in dp_groups or []}
    tallies: dict[tuple[Any, Any], _Tally] = defaultdict(_Tally)
    for row, times in rows:
        op = row.get("op")
        if op not in REDUCTIONS and op != "all_gather":
            continue
        ranks = row.get("group_ranks")
        if not (only_dp or (ranks and tuple(sorted(ranks)) in members)):
            continue
        tally = tallies[(row.get("rank"), row.get("step"))]
        tally.ops[op] += times
        if op == "all_gather" and row.get("ahead") is not None:  # packed_comms.gathers_ahead
            tally.gathered_ahead = tally.gathered_ahead or bool(row["ahead"])
            continue
        t0 = row.get("t0")
        if t0 is None:
            continue
        if op == "all_gather":
            tally.first_gather = t0 if tally.first_gather is None else min(tally.first_gather, t0)
        else:
            first = tally.first_reduction
            tally.first_reduction = t0 if first is None else min(first, t0)
    if not tallies:
        return None, "no data-parallel collective in the traces says how the state is sharded"
    stages = {_stage(t) for t in tallies.values()}
    if len(stages) > 1:
        return None, "the data-parallel collectives differ between steps or ranks"
    (stage,) = stages
    typical = max(tallies.values(), key=lambda t: sum(t.ops.values())).ops
    gathers, reductions = typical["all_gather"], typical["all_reduce"] + typical["reduce_scatter"]
    if stage == 0:
        return 0, f"{_times(reductions, 'gradient all-reduce')} a step, no parameter gathered"
    if stage == 3:
        return 3, (
            f"parameters all-gathered {gathers} times a step against {reductions} gradient "
            "reductions, the first before them (ZeRO-3 / FSDP full sharding)"
        )
    return None, (
        f"{gathers} parameter all-gathers and {reductions} gradient reductions a step: ZeRO-1 "
        "or 2 (or FSDP without resharding), which the collectives do not tell apart"
    )


def _times(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _stage(tally: _Tally) -> int | None:
    """One rank-step's stage: 0, 3, or None (1 or 2, or nothing that says)."""
    ops = tally.ops
    gathers, reductions = ops["all_gather"], ops["all_reduce"] + ops["reduce_scatter"]
    if gathers == 0 and ops["reduce_scatter"] == 0 and ops["all_reduce"] > 0:
        return 0
    gathered_first = tally.gathered_ahead or (
        tally.first_gather is not None
        and (tally.first_reduction is None or tally.first_gather < tally.first_reduction)
    )  # fmt: skip
    if gathers > reductions > 0 and gathered_first:
        return 3
    return None
