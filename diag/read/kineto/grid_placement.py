"""The grid of an older trace folder whose ops name no process group and show several kinds of
communication (issue 39): which ranks form the pipeline's stages and the tensor-parallel
groups, read from the order and the timing of what every rank's trace holds.

`placement.py` reads which kinds of communication a folder shows; alone they do not give the
axes' sizes. What the ranks do does:
- the pipeline's first stage: it opens each step by sending its first micro-batch's
  activations (with a receive issued in the same batch, in Megatron's interleaved schedule);
  every later stage opens it by receiving them alone (1F1B, GPipe and interleaved alike);
- tensor-parallel partners: the members of a tensor-parallel group meet at every layer's
  collective, and the members of an NCCL collective finish it within microseconds of each
  other, so their collectives' ends coincide one by one through the step; the ranks of
  another data-parallel replica drift apart by their own computation's noise. Ranks whose
  ends' differences wander by at most LOCKSTEP_NS beyond a steady offset (each host's clock,
  each device's conversion of its timestamps: the mean |difference - its median| over a
  step's collectives, in every step read), each with each, are together; every other pair
  must wander apart by at least APART_NS and APART_RATIO times the most any pair together
  did. A pair in between (a small model's replicas drift apart by microseconds only) leaves
  the layout unknown. Read among the first stage's ranks (every rank's, without a pipeline),
  wherever tensor parallelism shows: where no op has a size, no data parallelism shows (its
  gradients' all-reduces are the activations' op), yet it may be there.
The grid is the only dp x tp x pp = world, in either order (the data-parallel axis outermost,
as DeviceMesh's ("dp", "pp", "tp"); or the pipeline's, as Megatron-LM's tp-dp-pp), tensor
parallelism innermost, that puts the traced ranks opening with a send in its first stage and
no other, and the ranks found together in its tensor-parallel groups and no others. With
every rank traced that fixes pp (the world over the first stage's ranks) and tp (the groups'
size); with some ranks' traces missing (lost, or one per tensor-parallel group written) it
often still does. Where several grids fit (the ranks traced too few to tell) or none, the
layout is unknown, saying why; the source says how a grid was read.

Where several grids fit the first stage and the groups (one rank per tensor-parallel group
traced: no lockstep to read), the last stage tells them apart: its steps hold the fewest
messages of the ranks not opening with a send (a middle stage's activations and gradients go
both ways), and only one grid may put those ranks, and no other, in its last stage.

The traces are reduced where they are parsed (`marks`: per step, which kind of message opened
it, the median count of its messages, and the ends of a few steps' activation-sized
collectives), so a large folder's records never gather for this.
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
APART_NS = 8_000
APART_RATIO = 4.0
"""Ranks whose ends wander at least APART_NS and APART_RATIO times the most the ranks found
together did keep no step together; a pair between leaves the split of tensor and data
parallelism unknown (a small model's replicas drift apart by microseconds only: as little as
its members' ends may differ on a real device)."""
BATCHED_NS = 20_000
"""Ops issued together (`batch_isend_irecv`) start within this of each other."""
MARKED_STEPS = 2
"""Steps whose collectives' ends are kept per trace (after its first, the warm-up)."""
MARKED_ENDS = 128
"""Ends kept per marked step (the first, in the order the collectives start)."""
ORDERS: dict[str, tuple[str, ...]] = {
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
    messages_per_step: float = 0.0
    """The median over its steps of the sends and receives a step holds (0: none)."""


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
    counts = sorted(len(ops) for ops in messages.values())
    per_step = float(np.median(counts)) if counts else 0.0
    return PlacementMarks(dict(opens), ends, per_step)


def inferred(world: int, shown: frozenset[str], marks_of: dict[int, PlacementMarks]) -> Grid | str:
    """The grid of a world whose traces show the kinds `shown` (placement.SHOWS' keys: two or
    more of tp, dp, pp) from the traced ranks' marks: the only grid (sizes and order) that
    puts the ranks opening their steps with a send in its first stage and the ranks keeping
    step together in its tensor-parallel groups; else why not (for the headline)."""
    traced = sorted(marks_of)
    firsts = [
        r for r in traced if marks_of[r].opens.get("send", 0) > marks_of[r].opens.get("recv", 0)
    ]
    if PP in shown and not firsts:
        return "no traced rank opens its steps with a send, as a pipeline's first stage does"
    # the ranks compared for lockstep: the first stage's (every rank's, without a pipeline)
    compared = firsts if PP in shown else traced
    first_stage = set(firsts) if PP in shown else None
    partition: list[list[int]] | None = None
    if TP in shown:
        # read even where no data parallelism shows: a trace without sizes shows none (its
        # gradients' all-reduces are the activations' op, of no size to tell them apart)
        found = lockstep_groups(compared, marks_of)
        if isinstance(found, str):
            return found
        partition = found
    fits: dict[str, tuple[dict[str, int], tuple[str, ...], str]] = {}
    for sizes in _grid_sizes(world, shown):
        for said, order in ORDERS.items():
            if _fits(sizes, order, traced, first_stage, partition):
                # the orders lay out the same grid where data parallelism or the pipeline is 1
                same = sizes[DP] == 1 or sizes[PP] == 1
                key = repr((sizes, None if same else order))
                fits.setdefault(key, (sizes, order, said))
    if not fits and DP in shown and partition == [compared] and len(traced) == world:
        return (f"the {len(compared)} ranks of a stage keep step at every collective, where the "
                "gradients' reduction shows data parallelism (its replicas drift apart too "
                "little to be told from tensor parallelism)")  # fmt: skip
    if not fits:
        return ("the ranks opening their steps with a send and those keeping step together fit "
                "no grid (tensor parallelism innermost; data parallelism or the pipeline "
                "outermost; data parallelism where the gradients' reduction shows it)")  # fmt: skip
    lasts = _last_stage(traced, set(firsts), marks_of) if PP in shown else None
    if len(fits) > 1 and lasts:
        # the fewest messages tell the last stage where several grids fit the first alone
        last_fits = {k: f for k, f in fits.items() if _lasts_fit(f[0], f[1], traced, lasts)}
        fits = last_fits if len(last_fits) == 1 else fits
    if len(fits) > 1:
        shown_grids = "; ".join(_said(sizes) for sizes, _, _ in list(fits.values())[:3])
        return (f"the traces of {len(traced)} of {world} ranks fit {len(fits)} grids "
                f"({shown_grids}{'; ...' if len(fits) > 3 else ''})")  # fmt: skip
    ((sizes, grid_order, said),) = fits.values()
    groups = grid_groups(sizes, grid_order)
    how = []
    if PP in shown:
        some = " traced" if len(traced) < world else ""
        how.append(f"pp={sizes[PP]}: {len(firsts)} of {len(traced)} ranks{some} open each step "
                   "by sending (a pipeline's first stage)")  # fmt: skip
    if TP in shown:
        how.append(f"tp={sizes[TP]}: ranks ending their activations' collectives together "
                   f"(within {LOCKSTEP_NS / 1000:g} us, beyond a steady offset)")  # fmt: skip
    if sizes[PP] > 1 and sizes[DP] > 1:
        how.append(f"the grid's order {said}")
    how.append(f"dp={sizes[DP]}: what the others leave")
    if len(traced) < world:
        how.append(f"the only grid the {len(traced)} of {world} ranks traced fit")
        if lasts and _lasts_fit(sizes, grid_order, traced, lasts):
            how.append(f"{len(lasts)} of them the last stage (the fewest messages a step, "
                       "not opening with a send)")  # fmt: skip
    return Grid(sizes, groups, "; ".join(how))


LAST_STAGE_SHARE = 0.9
"""A rank not opening its steps with a send whose messages a step are at most this share of
the most any traced rank's are is the pipeline's last stage (1F1B and GPipe: half a middle
stage's; interleaved with two chunks a stage: three quarters)."""


def _last_stage(
    traced: list[int], firsts: set[int], marks_of: dict[int, PlacementMarks]
) -> set[int]:
    """The traced ranks of the pipeline's last stage: a middle stage receives and sends each
    micro-batch's activations and gradients, the last only its activations in and gradients
    out, so its steps hold fewer messages (the first stage's too, told by its opening send).
    Empty where no middle stage is traced (nothing to compare with)."""
    others = [r for r in traced if r not in firsts and marks_of[r].messages_per_step > 0]
    if not others:
        return set()
    most = max(marks_of[r].messages_per_step for r in others)
    return {r for r in others if marks_of[r].messages_per_step <= LAST_STAGE_SHARE * most}


def _lasts_fit(
    sizes: dict[str, int], order: tuple[str, ...], traced: list[int], lasts: set[int]
) -> bool:
    """Whether the grid puts the traced ranks read as the last stage in its last stage, and
    no other traced rank."""
    return all((_index(r, sizes, order, PP) == sizes[PP] - 1) == (r in lasts) for r in traced)


def _grid_sizes(world: int, shown: frozenset[str]) -> list[dict[str, int]]:
    """The sizes dp x tp x pp = world with an axis > 1 where its communication shows (the
    pipeline and tensor parallelism exactly so; data parallelism may hide where sizes are
    unknown, so it may also be > 1 unshown)."""
    out = []
    for pp in _divisors(world):
        for tp in _divisors(world // pp):
            dp = world // (pp * tp)
            if (
                (pp > 1) == (PP in shown)
                and (tp > 1) == (TP in shown)
                and (dp > 1 or DP not in shown)
            ):
                out.append({DP: dp, PP: pp, TP: tp})
    return out


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _said(sizes: dict[str, int]) -> str:
    return " x ".join(f"{axis}{sizes[axis]}" for axis in (DP, TP, PP) if sizes[axis] > 1)


def _fits(
    sizes: dict[str, int],
    order: tuple[str, ...],
    traced: list[int],
    firsts: set[int] | None,
    partition: list[list[int]] | None,
) -> bool:
    """Whether the grid of `sizes` laid out in `order` puts the traced ranks opening with a
    send (`firsts`) in its first stage, and no other traced rank, and the ranks of `partition`
    (the traced ranks compared, in the groups found keeping step) together exactly where its
    tensor-parallel groups do; None: not read. Computed on the traced ranks alone (a world
    of up to 2**20 ranks is never laid out whole to test a grid)."""
    if firsts is not None and any(
        (_index(r, sizes, order, PP) == 0) != (r in firsts) for r in traced
    ):
        return False
    if partition is not None:
        seen: set[tuple[int, ...]] = set()
        for found in partition:
            # a tensor-parallel group: the ranks at one place of every other axis
            of = {tuple(_index(r, sizes, order, a) for a in order if a != TP) for r in found}
            if sizes[TP] == 1 and len(found) > 1:
                return False
            if len(of) != 1 or of & seen:
                return False
            seen |= of
    return True


def _index(rank: int, sizes: dict[str, int], order: tuple[str, ...], axis: str) -> int:
    """The rank's place along `axis` in the grid of `sizes` laid out in `order` (outermost
    first)."""
    stride = 1
    for later in reversed(order[order.index(axis) + 1 :]):
        stride *= sizes[later]
    return (rank // stride) % sizes[axis]


def lockstep_groups(ranks: list[int], marks_of: dict[int, PlacementMarks]) -> list[list[int]] | str:
    """The ranks in groups keeping step at every collective (within LOCKSTEP_NS of each other,
    each with each, and apart from every other rank: APART_NS, APART_RATIO; a rank keeping
    step with none alone); else why they are not read."""
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
        close = spread <= LOCKSTEP_NS
        apart_ns = max(APART_NS, APART_RATIO * float(spread[close].max()))
        between = ~close & (spread < apart_ns)
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
    return sorted(sorted(g) for g in groups)


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
    source = f"{placement.GRID_READ} {shown}; {grid.how}"
    return FoundLayout(layout, grid.groups, source)
