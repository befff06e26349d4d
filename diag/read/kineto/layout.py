"""The job's layout (dp x tp x pp x ep x cp) and its process groups, read from the traces.

Where the groups come from: `distributedInfo.pg_config` (each group the traced rank belongs
to, with its ranks) and the `Process Group Ranks` of `record_param_comms`. Which axis a group is
comes from what it carries and where, never from its name (Megatron's `TENSOR_MODEL_PARALLEL_
GROUP`, DeviceMesh's `mesh_tp`, `pg3`: hints only, used when nothing else decides):
- sends and receives: the pipeline; round a ring (each rank sends to one member, receives
  from another, the last sending to the first), context parallel (ring attention); in groups
  of two, where a ring and a pipeline have the same peers, only ever swapped (every send
  starting with a receive: ring attention's rounds; a pipeline's first stage sends its first
  activations alone), context parallel;
- all-to-alls: the experts; of two groups carrying them, the one issuing more per step is
  context parallel (Ulysses: the sequence's q, k, v and output, every layer), the other the
  experts (dispatch and combine, every MoE layer);
- other collectives: of two families of groups, the one issuing more of them per step (the
  activations' all-reduces of every layer, forward and backward) is tensor parallel, the
  other (the gradients' reduction, a few large buckets) data parallel; a single family is
  tensor parallel when its collectives start inside the forward pass (the step's first
  quarter), else data parallel.
Groups of one axis are translates of each other (`[0, 1, 2, 3]`, `[4, 5, 6, 7]`): a family is
the groups of one shape, and the shape tiles the world, so the groups of ranks nobody traced
follow (one trace per tensor-parallel group is enough). Groups of different axes share at most
one rank: a family that shares two with one already placed (Megatron's model-parallel or
embedding groups) is no axis. Data parallel is what the other axes leave: the ranks at the same
place in each of them. Everything is bounded by the world size (diag/contract/limits.py).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from diag.contract import schema
from diag.contract.names import DP, EP, PP, TP, WORLD
from diag.read.kineto import placement
from diag.read.kineto.placement import COLLECTIVE_OPS, FROM_GROUPS, FoundLayout

ONE_RANK = "of one rank (nothing to lay out)"

GIVEN = "given"
CP = "cp"
"""Context parallelism's groups (the manifest's axis; the simulator writes none)."""
MAX_GROUPS = 4096
"""Distinct process groups read from a folder's traces (more: the rest ignored)."""
EXCHANGE_LONE_SHARE = 0.1
"""A group of two swaps messages if at most this share of its rank-steps has a lone one."""
NAME_HINTS = (
    (TP, ("tensor", "mesh_tp", "tp")),
    (PP, ("pipeline", "mesh_pp", "pp")),
    (EP, ("expert", "mesh_ep", "ep")),
    (DP, ("data", "mesh_dp", "dp", "fsdp", "shard", "replicate")),
)  # fmt: skip
"""Words in a group's name that hint at its axis, used only to break a tie."""


@dataclass
class Family:
    """Process groups of one shape (each rank list minus its first rank)."""

    groups: set[tuple[int, ...]] = field(default_factory=set)
    names: set[str] = field(default_factory=set)
    ops: Counter[str] = field(default_factory=Counter)
    per_step: Counter[tuple[int, int]] = field(default_factory=Counter)  # (rank, step) -> ops
    early: int = 0  # collectives that start in their step's first quarter
    collectives: int = 0
    sent_to: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    received_from: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    # groups of two: per rank-step with sends or receives, whether one was alone
    lone_p2p: dict[tuple[int, int], bool] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(next(iter(self.groups)))

    def ops_per_step(self) -> float:
        return sum(self.per_step.values()) / max(len(self.per_step), 1)

    def ring(self) -> bool:
        """Whether its messages go round a ring: each rank sends to one member and receives
        from another (context parallelism's blocks of keys and values, passed on every step
        of a layer's attention), where a pipeline's middle stages send both ways (activations
        forward, gradients back) and its ends trade with one neighbour only. Unknown (False)
        in groups of two, where both look alike, and where no message names its peer."""
        if self.size < 3 or not self.sent_to or not self.received_from:
            return False
        for rank in set(self.sent_to) | set(self.received_from):
            to, came = self.sent_to.get(rank, set()), self.received_from.get(rank, set())
            if len(to) != 1 or len(came) != 1 or to == came:
                return False
        return True

    def exchanges(self) -> bool:
        """Whether a group of two only ever swaps messages: every send of a rank-step starts
        with a receive of the same rank (packed_comms.EXCHANGE_NS), as ring attention's rounds
        do, where a
        two-stage pipeline's first stage sends its first micro-batch's activations alone (its
        warm-up) and its last stage receives them alone, every step. Rank-steps with a lone
        message: at most EXCHANGE_LONE_SHARE of them (a ring pair split by a descheduled
        host thread)."""
        if self.size != 2 or not self.lone_p2p:
            return False
        lone = sum(self.lone_p2p.values())
        return lone <= EXCHANGE_LONE_SHARE * len(self.lone_p2p)

    def hinted(self) -> str | None:
        words = " ".join(self.names).lower()
        for axis, hints in NAME_HINTS:
            if any(hint in words for hint in hints):
                return axis
        return None


def infer_layout(
    world: int,
    config_groups: Iterable[tuple[tuple[int, ...], str]],
    comms: list[dict[str, Any]],
    steps: list[dict[str, Any]],
) -> FoundLayout:
    """The layout and groups of a world of `world` ranks from the groups the traces list
    ((ranks, name) of pg_config) and their comm records (with `group_ranks`, popped later)."""
    if world == 1:  # nothing to lay out: every axis is 1, whatever the traces list
        return FoundLayout(schema.Layout(dp=1), {}, ONE_RANK)
    config_groups = list(config_groups)
    families = _families(world, config_groups, comms, steps)
    placed: dict[str, Family] = {}
    reasons: list[str] = []
    carrying = [f for f in families.values() if f.ops]
    rings = [f for f in carrying
             if (f.ring() or f.exchanges()) and _p2p(f) > sum(f.ops.values()) / 2]  # fmt: skip
    if rings:  # sends and receives round a ring: context parallel, not a pipeline
        placed[CP] = ring = max(rings, key=_p2p)
        reasons.append(
            "the group passing messages round a ring is context parallel" if ring.size > 2
            else "the groups of two only swapping messages (no stage sending alone, as a "
            "pipeline's first does) are context parallel"
        )  # fmt: skip
    for axis, wanted in ((PP, _p2p), (EP, _all_to_all)):
        for family in sorted(carrying, key=lambda f: -wanted(f)):
            if wanted(family) > sum(family.ops.values()) / 2 and _orthogonal(family, placed):
                placed[axis] = family
                break
    if EP in placed and CP not in placed:  # two groups' all-to-alls: experts and Ulysses
        mostly = [f for f in carrying if _all_to_all(f) > sum(f.ops.values()) / 2]
        other = next((f for f in sorted(mostly, key=lambda f: -_all_to_all(f))
                      if _orthogonal(f, placed)), None)  # fmt: skip
        if other is not None:  # the sequence's, four a layer's attention (q, k, v, out),
            pair = sorted((placed[EP], other), key=lambda f: -f.ops_per_step())  # beat the
            placed[CP], placed[EP] = pair  # tokens' two a MoE layer
            reasons.append("of two groups' all-to-alls, the more frequent is context parallel")
    collective = [f for f in carrying if f.collectives and _orthogonal(f, placed)]
    collective.sort(key=lambda f: (-f.ops_per_step(), f.size))
    if collective:
        first = collective[0]
        second = next((f for f in collective[1:] if _orthogonal(f, {"x": first})), None)
        if second is not None:
            placed[TP], placed[DP] = first, second
            reasons.append("the group issuing more collectives per step is tensor parallel")
        else:
            axis, why = _single(first)
            placed[axis] = first
            reasons.append(why)
    listed = bool(config_groups) or any(c.get("group_ranks") for c in comms)
    return _built(world, placed, families, reasons, listed, comms, steps)


def _p2p(family: Family) -> int:
    return family.ops["send"] + family.ops["recv"]


def _all_to_all(family: Family) -> int:
    return family.ops["all_to_all"]


def _single(family: Family) -> tuple[str, str]:
    """The axis of the only family carrying collectives, and why."""
    early = family.early / max(family.collectives, 1)
    sharded = {"all_gather", "reduce_scatter"} >= {op for op in family.ops if family.ops[op]}
    hint = family.hinted()
    if hint in (TP, DP) and (early == 0 or sharded):
        return hint, f"its collectives' placement is not decisive, the group's name says {hint}"
    if early > 0 and not sharded:
        return TP, "its collectives start inside the forward pass (tensor parallel)"
    return DP, "its collectives come after the forward pass (gradient reduction: data parallel)"


def _orthogonal(family: Family, placed: dict[str, Family]) -> bool:
    """Whether none of the family's groups shares two ranks with a group already placed (in
    time linear in their ranks: each rank's groups in the other family, counted per group)."""
    for other in placed.values():
        if other is family:
            return False
        owners: dict[int, list[int]] = defaultdict(list)
        for i, theirs in enumerate(other.groups):
            for r in theirs:
                owners[r].append(i)
        for mine in family.groups:
            shared = Counter(i for r in mine for i in owners.get(r, ()))
            if any(n > 1 for n in shared.values()):
                return False
    return True


def _families(
    world: int,
    config_groups: Iterable[tuple[tuple[int, ...], str]],
    comms: list[dict[str, Any]],
    steps: list[dict[str, Any]],
) -> dict[tuple[int, ...], Family]:
    families: dict[tuple[int, ...], Family] = defaultdict(Family)
    seen = 0

    def add(ranks: tuple[int, ...], name: str) -> Family | None:
        nonlocal seen
        if not 1 < len(ranks) < world or ranks[-1] >= world:
            return None
        family = families[tuple(r - ranks[0] for r in ranks)]
        if ranks not in family.groups:
            if seen >= MAX_GROUPS:
                return None
            seen += 1
            family.groups.add(ranks)
        if name:
            family.names.add(name)
        return family

    for ranks, name in config_groups:
        add(ranks, name)
    windows = {(s["rank"], s["step"]): (s["t0"], s["t1"]) for s in steps}
    for comm, times in _counted(comms):
        members: tuple[int, ...] | None = comm.get("group_ranks")
        if not members:
            continue
        family = add(members, comm.get("group") or "")
        op = comm.get("op")
        if family is None or not op:
            continue
        family.ops[op] += times
        family.per_step[(comm["rank"], comm["step"])] += times
        peer = comm.get("peer")
        if peer is not None and op in ("send", "recv"):
            (family.sent_to if op == "send" else family.received_from)[comm["rank"]].add(peer)
        alone = comm.get("alone")
        if alone is not None:  # a send or receive of a group of two (packed_comms)
            key = (comm["rank"], comm["step"])
            family.lone_p2p[key] = family.lone_p2p.get(key, False) or bool(alone)
        if op in COLLECTIVE_OPS:
            family.collectives += times
            t0, t1 = windows.get((comm["rank"], comm["step"]), (0, 0))
            family.early += times * placement.starts_early(comm["t0"], t0, t1)
    return families


def _counted(comms: Iterable[dict[str, Any]]) -> Iterable[tuple[dict[str, Any], int]]:
    """Each collective with how many times it occurs in a row: the distinct rows of a
    packed_comms.LayoutView with their counts (the same tallies in one pass per distinct
    value: everything `_families` does with a repeat is idempotent or a count), else each
    record once."""
    rows = getattr(comms, "rows", None)
    return rows if rows is not None else ((comm, 1) for comm in comms)


def _built(
    world: int,
    placed: dict[str, Family],
    families: dict[Any, Family],
    reasons: list[str],
    listed: bool,
    comms: list[dict[str, Any]],
    steps: list[dict[str, Any]],
) -> FoundLayout:
    """The layout from the families placed: each tiled over the world, data parallel from
    what they leave; without groups but the world's, what the placement of the ops tells
    (placement.py); unknown, saying why, when nothing fits."""
    tiled: dict[str, list[list[int]]] = {}
    for axis, family in placed.items():
        groups = _tiled(world, family)
        if groups is not None:
            tiled[axis] = groups
    sizes = {axis: len(groups[0]) for axis, groups in tiled.items()}
    inner = sizes.get(TP, 1) * sizes.get(PP, 1) * sizes.get(EP, 1) * sizes.get(CP, 1)
    if not families:  # no group but the world's: what the world's group carries tells
        return placement.from_placement(world, comms, steps, listed)
    if not tiled or world % inner:
        return placement.unknown(world, "the traces' process groups carry no communication "
                                        "that tells their axis")  # fmt: skip
    tiled.pop(DP, None)  # what the others leave, so the product is the world
    dp_groups = _complement(world, tiled)
    if dp_groups is None:
        return placement.unknown(world, "the traces' process groups do not form a grid")
    if len(dp_groups[0]) > 1:
        tiled[DP] = dp_groups
    tiled[WORLD] = [list(range(world))]
    layout = schema.Layout(
        dp=world // inner, tp=sizes.get(TP, 1), pp=sizes.get(PP, 1), ep=sizes.get(EP, 1),
        cp=sizes.get(CP, 1),
    )  # fmt: skip
    source = FROM_GROUPS + (f" ({'; '.join(reasons)})" if reasons else "")
    return FoundLayout(layout, tiled, source)


def _tiled(world: int, family: Family) -> list[list[int]] | None:
    """The family's shape laid over every rank of the world, its groups as observed where
    there are some; None when the shape does not tile the world."""
    offsets = next(iter(family.groups))
    offsets = tuple(r - offsets[0] for r in offsets)
    owner = [-1] * world
    out: list[list[int]] = []
    for group in sorted(family.groups):
        if any(owner[r] >= 0 for r in group):
            return None
        for r in group:
            owner[r] = len(out)
        out.append(list(group))
    for base in range(world):
        if owner[base] >= 0:
            continue
        tile = [base + o for o in offsets]
        if tile[-1] >= world or any(owner[r] >= 0 for r in tile):
            return None
        for r in tile:
            owner[r] = len(out)
        out.append(tile)
    return sorted(out) if len(out) * len(offsets) == world else None


def _complement(world: int, tiled: dict[str, list[list[int]]]) -> list[list[int]] | None:
    """The groups of ranks at the same place in every axis's group: data parallel."""
    place: list[list[int]] = [[] for _ in range(world)]
    for axis in sorted(tiled):
        for group in tiled[axis]:
            for i, r in enumerate(group):
                place[r].append(i)
    by_place: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for r in range(world):
        by_place[tuple(place[r])].append(r)
    groups = sorted(by_place.values())
    if len({len(g) for g in groups}) != 1 or len(groups) * len(groups[0]) != world:
        return None
    return groups
