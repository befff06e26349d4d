"""The grid of an older trace folder whose ops name no process group and show several kinds of
communication (issue 39): which ranks form the pipeline's stages and the tensor-parallel
groups, read from the order and the timing of what every rank's trace holds.

`placement.py` reads which kinds of communication a folder shows; alone they do not give the
axes' sizes. With every rank traced, these do:
- the pipeline (pp): its first stage opens each step by sending its first micro-batch's
  activations (with a receive issued in the same batch, in Megatron's interleaved schedule);
  every later stage opens it by receiving them alone (1F1B, GPipe and interleaved alike). The
  ranks whose steps open with a send are the world's 1/pp.
- tensor parallel against data parallel among the ranks of one stage (both shown): the
  members of a tensor-parallel group meet at every layer's collective, and the members of an
  NCCL collective finish it within microseconds of each other, so their collectives' ends
  coincide one by one through the step; the ranks of another data-parallel replica drift
  apart by their own computation's noise. Ranks whose ends' differences wander by at most
  LOCKSTEP_NS beyond a steady offset (each host's clock, each device's conversion of its
  timestamps: the mean |difference - its median| over a step's collectives, in every step
  read), each with each, form a group; every other pair must wander at least APART_NS apart.
  A pair in between (a small model's replicas drift apart by microseconds only) or groups of
  unequal sizes leave the split unknown. The layout's source says how it was read.
- where the groups lie: the grid's orders that put the first stage's ranks and these groups
  where they were found: the data-parallel axis outermost (DeviceMesh's ("dp", "pp", "tp")),
  or the pipeline's (Megatron-LM's tp-dp-pp order); neither: unknown.
A folder missing some ranks' traces is left unknown: the share of first-stage ranks, and who
keeps step with whom, need every rank.

The traces are reduced where they are parsed (`marks`: per step, which kind of message opened
it, and the ends of a few steps' activation-sized collectives), so a large folder's records
never gather for this.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diag.contract import schema
from diag.contract.names import DP, PP, TP, grid_groups
from diag.read.kineto import placement
from diag.read.kineto.placement import ACTIVATION_OPS, P2P_OPS, FoundLayout, starts_early

LOCKSTEP_NS = 5_000
"""Members of one collective end it together: their ends' differences wander by at most this
(the mean |difference - its median| over a step's collectives), beyond a steady offset."""
APART_NS = 25_000
"""Ranks whose ends wander at least this far apart keep no step together; between the two,
the split of tensor and data parallelism is unknown (a small model's replicas drift apart by
microseconds only: as little as its members' ends may differ on a real device)."""
BATCHED_NS = 20_000
"""Ops issued together (`batch_isend_irecv`) start within this of each other."""
MARKED_STEPS = 2
"""Steps whose collectives' ends are kept per trace (after its first, the warm-up)."""
MARKED_ENDS = 128
"""Ends kept per marked step (the first, in the order the collectives start)."""
ORDERS = {
    "data parallel outermost (DeviceMesh's dp, pp, tp)": (DP, PP, TP),
    "the pipeline outermost (Megatron-LM's tp-dp-pp)": (PP, DP, TP),
}
"""The grid orders tried, tensor parallelism innermost in each, with how the source says them."""


@dataclass
class PlacementMarks:
    """What this module reads of one trace: made by its worker (`marks`)."""

    opens: dict[str, int] = field(default_factory=dict)
    """Steps whose first batch of messages holds a send, and the others: {"send": n, "recv": n}."""
    ends_ns: dict[int, list[int]] = field(default_factory=dict)
    """Per marked step, the ends of its activation-sized collectives, in the order they start."""


@dataclass(frozen=True)
class Grid:
    """A grid read from the marks: the axes' sizes, their groups and how they were read."""

    sizes: dict[str, int]
    groups: dict[str, list[list[int]]]
    how: str


def marks(comms: list[dict[str, Any]], steps: list[dict[str, Any]]) -> PlacementMarks:
    """One trace's marks; none where its ops name their groups (this module is not needed)."""
    if any(c.get("group") or c.get("group_ranks") for c in comms):
        return PlacementMarks()
    described = [c for c in comms if not c.get("from_name")]
    messages: dict[Any, list[tuple[int, str]]] = {}
    for comm in described:
        if comm.get("op") in P2P_OPS and comm.get("step") is not None:
            messages.setdefault(comm["step"], []).append((int(comm["t0"]), str(comm["op"])))
    opens: Counter[str] = Counter()
    for ops in messages.values():
        # the step's first batch: Megatron's interleaved first stage sends its activations
        # together with a receive from the last stage (for its next chunk), the receive first
        t0 = min(start for start, _ in ops)
        sends = any(op == "send" and start - t0 <= BATCHED_NS for start, op in ops)
        opens["send" if sends else "recv"] += 1
    activations = [c for c in described if c.get("op") in ACTIVATION_OPS]
    sizes = Counter(float(c.get("bytes") or 0) for c in activations)
    # every layer's activations, forward and backward: the size issued most often (the
    # gradients' buckets are larger and few); sizes unknown, those in the forward pass
    size = max(sizes, key=lambda s: (sizes[s], -s)) if sizes else 0.0
    windows = {s["step"]: (s["t0"], s["t1"]) for s in steps}
    if size <= 0:
        activations = [
            c for c in activations if starts_early(c["t0"], *windows.get(c["step"], (0, 0)))
        ]
    else:
        activations = [c for c in activations if float(c.get("bytes") or 0) == size]
    steps_seen = sorted({c["step"] for c in activations if c.get("step") is not None})
    marked = steps_seen[1 : 1 + MARKED_STEPS]  # after the first, the warm-up
    ends: dict[int, list[int]] = {}
    for step in marked:
        ones = sorted((c for c in activations if c["step"] == step), key=lambda c: c["t0"])
        ends[int(step)] = [int(c["t1"]) for c in ones[:MARKED_ENDS]]
    return PlacementMarks(dict(opens), ends)


def inferred(world: int, shown: frozenset[str], marks_of: dict[int, PlacementMarks]) -> Grid | str:
    """The grid of a world whose traces show the kinds `shown` (placement.SHOWS' keys: two or
    more of tp, dp, pp) from every rank's marks; else why not (for the headline)."""
    if len(marks_of) < world:
        return f"the traces of {len(marks_of)} of {world} ranks, where this needs every rank's"
    pp = 1
    stage = sorted(marks_of)
    if PP in shown:
        firsts = [r for r, m in sorted(marks_of.items())
                  if m.opens.get("send", 0) > m.opens.get("recv", 0)]  # fmt: skip
        if not firsts or world % len(firsts) or len(firsts) == world:
            return (f"{len(firsts)} of {world} ranks open their steps with a send, which is "
                    "no pipeline's first stage")  # fmt: skip
        pp, stage = world // len(firsts), firsts
        how = [f"pp={pp}: {len(firsts)} of {world} ranks open each step by sending "
               "(a pipeline's first stage)"]  # fmt: skip
    else:
        how = []
    tp_groups: list[list[int]] | None = None
    if TP in shown and DP in shown:
        found = lockstep_groups(stage, marks_of)
        if isinstance(found, str):
            return found
        tp_groups = found
        tp = len(found[0])
        how.append(f"tp={tp}: ranks ending their activations' collectives together "
                   f"(within {LOCKSTEP_NS / 1000:g} us, beyond a steady offset)")  # fmt: skip
    else:
        tp = world // pp if TP in shown else 1
    sizes = {DP: world // (pp * tp), PP: pp, TP: tp}
    if DP in shown and sizes[DP] < 2:
        return (f"the {len(stage)} ranks of a stage keep step at every collective, where the "
                "gradients' reduction shows data parallelism")  # fmt: skip
    for said, order in ORDERS.items():
        groups = grid_groups(sizes, order)
        if _fits(groups, stage if PP in shown else None, tp_groups):
            if sizes[PP] > 1 and sizes[DP] > 1:
                how.append(f"the grid's order {said}")
            how.append(f"dp={sizes[DP]}: what the others leave")
            return Grid(sizes, groups, "; ".join(how))
    return "the ranks found together fit no grid order (tensor parallelism innermost)"


def _fits(
    groups: dict[str, list[list[int]]], firsts: list[int] | None, tp_groups: list[list[int]] | None
) -> bool:
    """Whether a grid's groups put the first stage (`firsts`) and the tensor-parallel groups
    (those of the ranks read) where they were found; None: not read."""
    if firsts is not None and sorted(g[0] for g in groups.get(PP, [])) != sorted(firsts):
        return False
    if tp_groups is not None:
        read = {r for g in tp_groups for r in g}
        grid = sorted(sorted(g) for g in groups.get(TP, []) if g[0] in read)
        return grid == sorted(sorted(g) for g in tp_groups)
    return True


def lockstep_groups(ranks: list[int], marks_of: dict[int, PlacementMarks]) -> list[list[int]] | str:
    """The ranks' groups keeping step at every collective (within LOCKSTEP_NS of each other,
    each with each, and at least APART_NS from every other rank), each of the same size (at
    least two); else why they are not read."""
    steps = sorted(set.intersection(*(set(marks_of[r].ends_ns) for r in ranks))) if ranks else []
    if not steps:
        return "no step whose activations' collectives every rank of a stage traced"
    groups: list[list[int]] = []
    # ranks issuing different numbers of these collectives in a step meet at none of them
    by_counts: dict[tuple[int, ...], list[int]] = {}
    for r in ranks:
        by_counts.setdefault(tuple(len(marks_of[r].ends_ns[s]) for s in steps), []).append(r)
    for counts, alike in by_counts.items():
        if not all(counts):
            groups += [[r] for r in alike]
            continue
        ends = [np.array([marks_of[r].ends_ns[s] for r in alike], dtype=np.int64) for s in steps]
        spread = np.stack([_spread_ns(ends, i) for i in range(len(alike))])
        between = (spread > LOCKSTEP_NS) & (spread < APART_NS)
        if between.any():
            i, j = (int(x) for x in np.argwhere(between)[0])
            return (f"ranks {alike[i]} and {alike[j]} end their collectives "
                    f"{spread[i, j] / 1000:.0f} us apart (beyond a steady offset): neither "
                    "together nor apart")  # fmt: skip
        left = list(range(len(alike)))
        while left:  # together is each with each (no rank between: an equivalence)
            together = [j for j in left if spread[left[0], j] <= LOCKSTEP_NS]
            if any(spread[a, b] > LOCKSTEP_NS for a in together for b in together):
                return f"ranks {alike[left[0]]} and others keep step only through others"
            groups.append([alike[j] for j in together])
            left = [j for j in left if j not in together]
    found = sorted(sorted(g) for g in groups)
    if len({len(g) for g in found}) != 1 or len(found[0]) < 2:
        sizes = sorted({len(g) for g in found})
        return f"the ranks keeping step at every collective form groups of {sizes} ranks"
    return found


def _spread_ns(ends: list[np.ndarray], i: int) -> np.ndarray:
    """For each rank (row of each step's `ends`), how far its collectives' ends wander from
    rank i's beyond a steady offset (each host's clock, each device's conversion of its
    timestamps to it): the mean |difference - its median| in each step, the largest over the
    steps."""
    worst = np.zeros(len(ends[0]))
    for step in ends:
        diff = (step - step[i]).astype(np.float64)
        diff -= np.median(diff, axis=1, keepdims=True)
        worst = np.maximum(worst, np.abs(diff).mean(axis=1))
    return worst


def refined(found: FoundLayout, world: int, marks_of: dict[int, PlacementMarks]) -> FoundLayout:
    """`found` (placement.from_placement's) with its grid read where it was unknown for showing
    several kinds of communication (its `shown`); else as it was, with why added."""
    if len(found.shown) < 2 or "a2a" in found.shown:
        return found
    grid = inferred(world, found.shown, marks_of)
    if isinstance(grid, str):
        return FoundLayout(found.layout, found.groups, f"{found.source}; not read: {grid}")
    layout = schema.Layout(dp=grid.sizes[DP], tp=grid.sizes[TP], pp=grid.sizes[PP])
    shown = " and ".join(placement.SHOWS[k] for k in (TP, DP, PP) if k in found.shown)
    source = (
        f"{placement.INFERRED}: {placement.NO_GROUPS}; their placement shows {shown}; {grid.how}"
    )
    return FoundLayout(layout, grid.groups, source)
