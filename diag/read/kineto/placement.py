"""The layout where the traces list no process group but the world's: from where each rank's
communication sits in its step and how large it is (issue 39).

PyTorch before 2.2 writes no group arguments and no `pg_config`; a job whose only group is
the world lists just that one. What the ops show then, per rank and step:
- tensor parallel: all-reduces, all-gathers or reduce-scatters inside the forward pass
  (starting in the step's first FORWARD_SHARE) that block the computation (nothing computes
  under them; where the trace cannot say, any): every layer's, forward and backward (a
  broadcast there is DDP's of its buffers; DDP's bucket all-reduces overlap the backward);
- data parallel: collectives of gradient size after the forward pass (larger than any of the
  forward's, or the only ones), of an op the forward pass never runs (sizes unknown), or a
  reduce-scatter and all-gather pair (ZeRO / FSDP around the optimizer); all-gathers alone in
  the forward pass are the parameters' (ZeRO-3 / FSDP: tensor parallelism reduces there too);
- a pipeline: sends and receives;
- experts or context parallel: all-to-alls (which of the two, and of what size, the ops alone
  do not tell).
One of these alone, on every rank of the world traced (data parallel: on any), spans every
rank (nothing else communicates, so no other axis exists): the layout is inferred, saying
why. Several together, their sizes are not in the traces (which
rank a collective waited for is, but not who else was in its group): the layout is unknown,
the headline says so with what the placement shows, and every rank stands in one group of
the world (`Layout(dp=world)` with no groups), so no rule reads a pipeline, a tensor-parallel
group or a data-parallel group the traces do not give. `--layout` gives it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Any

from diag.contract import schema
from diag.contract.names import DP, PP, TP, grid_groups

FROM_GROUPS = "from the traces' process groups"
INFERRED = "inferred"
UNKNOWN = "unknown"
COLLECTIVE_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"})
ACTIVATION_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter"})
"""The collectives tensor (and sequence) parallelism runs on activations."""
P2P_OPS = frozenset({"send", "recv"})
FORWARD_SHARE = 0.25
"""A collective starting in this first share of its step's window is inside the forward pass."""
NO_GROUPS = "no process groups in the traces (PyTorch before 2.2 writes none)"
WORLD_ONLY = "the traces list no process group but the world's"
GRID_READ = f"{INFERRED}: {NO_GROUPS}; their placement shows"
"""How a layout read from the placement across several axes (grid_placement.py) begins its
source: its ops, which name no group, are then named by placement, as in a layout given."""
SHOWS = {
    TP: "tensor-parallel collectives inside the forward and backward passes",
    DP: "data-parallel gradient reduction after the forward pass",
    PP: "a pipeline's sends and receives",
    "a2a": "all-to-alls (experts or context parallel)",
}
"""What each kind of communication the placement tells shows, in the headline's words."""


@dataclass
class FoundLayout:
    layout: schema.Layout
    groups: dict[str, list[list[int]]]
    source: str
    shown: frozenset[str] = frozenset()
    """Where the layout is unknown from the placement of ops naming no group: the kinds of
    communication it shows (SHOWS' keys), which grid_placement.py reads the grid of."""

    def replaced(self, text: str | None, **fields: Any) -> FoundLayout:
        """The layout with `fields` of its `layout` replaced and `text` (what they were read
        from, or why unknown) added to its source; None: nothing to add."""
        source = self.source if text is None else f"{self.source}; {text}"
        return FoundLayout(replace(self.layout, **fields), self.groups, source)


def grid_size(layout: schema.Layout) -> int:
    """The ranks a layout's grid spans: dp x tp x pp x ep x cp (a cp unset counted as 1)."""
    return layout.dp * layout.tp * layout.pp * layout.ep * (layout.cp or 1)


def unknown(world: int, why: str) -> FoundLayout:
    """The layout the traces do not give: every rank in one group, no axis claimed."""
    return FoundLayout(schema.Layout(dp=world), {}, f"{UNKNOWN}: {why}")


def is_unknown(source: str | None) -> bool:
    """Whether a manifest's `layout_source` says the layout is unknown (rules that need the
    layout claim nothing from it then)."""
    return bool(source) and str(source).startswith(UNKNOWN)


def named_by_placement_in(source: str | None) -> bool:
    """Whether a layout read from the traces (its `layout_source`) was read from the placement
    of ops that name no group, across more than one axis (grid_placement.py): those ops are
    then named by placement, as in a layout given (`name_by_placement`)."""
    return bool(source) and str(source).startswith(GRID_READ)


def starts_early(start_ns: int, step_t0_ns: int, step_t1_ns: int) -> bool:
    """Whether a collective starting at `start_ns` does so in its step window's first
    FORWARD_SHARE. One that started before its window opened ran while the previous step's
    work was still running (launched early, on a stream of its own), so it needed none of
    this step's: it is not early."""
    return step_t1_ns > step_t0_ns and (
        0 <= start_ns - step_t0_ns < FORWARD_SHARE * (step_t1_ns - step_t0_ns)
    )


def kinds_shown(comms: list[dict[str, Any]], steps: list[dict[str, Any]]) -> set[str]:
    """Which kinds of communication (SHOWS' keys) the ops' placement and sizes show."""
    windows = {(s["rank"], s["step"]): (s["t0"], s["t1"]) for s in steps}
    kinds: set[str] = set()
    per_rank: dict[Any, list[tuple[bool, float, str]]] = defaultdict(list)
    for comm in comms:
        op = comm.get("op")
        if comm.get("from_name"):
            # a kernel no CPU op describes: its name is no evidence of its group's place (an
            # NCCL SendRecv kernel may be a pipeline's message or part of an all-to-all), but
            # a kernel named an all-to-all is one (DeepEP's dispatch and combine: MoE tokens)
            if op == "all_to_all":
                kinds.add("a2a")
            continue
        if op in P2P_OPS:
            kinds.add(PP)
        elif op == "all_to_all":
            kinds.add("a2a")
        elif op in COLLECTIVE_OPS:
            t0, t1 = windows.get((comm.get("rank"), comm.get("step")), (0, 0))
            # a broadcast at the step's start is DDP's of its buffers, not an activation's; an
            # early collective the computation runs on under (not blocking: DDP's bucket
            # all-reduces overlapping the backward pass) is no activation's either, nor one
            # that ran before its step's window opened (the previous step's work still
            # running: it needed none of this step's)
            early = (
                op in ACTIVATION_OPS and comm.get("blocking") is not False
                and starts_early(comm["t0"], t0, t1)
            )  # fmt: skip
            per_rank[comm.get("rank")].append((early, float(comm.get("bytes") or 0), str(op)))
    for ops in per_rank.values():
        if {op for early, _, op in ops if early} == {"all_gather"}:
            # gathers alone in the forward pass, no activation reduced there: the parameters
            # gathered layer by layer (ZeRO-3 / FSDP), the data-parallel group's, not TP's
            ops = [(False, size, op) for _, size, op in ops]
        early_sizes = [size for early, size, _ in ops if early]
        late = [(size, op) for early, size, op in ops if not early]
        if early_sizes:
            kinds.add(TP)
        largest_early = max(early_sizes, default=-1.0)
        if any(size > largest_early for size, _ in late):  # gradient-sized, or the only ones
            kinds.add(DP)
        late_ops = {op for _, op in late if op in ACTIVATION_OPS}
        early_ops = {op for early, _, op in ops if early}
        if {"reduce_scatter", "all_gather"} <= late_ops or late_ops - early_ops:
            kinds.add(DP)  # ZeRO's pair around the optimizer; an op the forward never runs
    return kinds


def from_placement(
    world: int, comms: list[dict[str, Any]], steps: list[dict[str, Any]], listed: bool
) -> FoundLayout:
    """The layout of a folder whose traces list no group but (`listed`) the world's."""
    where = WORLD_ONLY if listed else NO_GROUPS
    kinds = kinds_shown(comms, steps)
    if not kinds:
        return unknown(world, f"{where}, and no communication in them tells the layout")
    shown = " and ".join(SHOWS[k] for k in (TP, DP, PP, "a2a") if k in kinds)
    if len(kinds) > 1 or kinds == {"a2a"}:
        found = unknown(world, f"{where}; their placement shows {shown}, of sizes the traces "
                               "do not give (--layout gives them)")  # fmt: skip
        return replace(found, shown=frozenset(kinds)) if not listed else found
    traced = len({s.get("rank") for s in steps} | {c.get("rank") for c in comms})
    # a rank of a job with a pipeline or tensor parallelism communicates in them, so gradient
    # reduction alone on some ranks is every rank's; what else one rank's file shows need not be
    if traced < world and kinds != {DP}:
        return unknown(world, f"{where}; the traces of {traced} of {world} ranks show only "
                              f"{shown}, which need not span the others")  # fmt: skip
    (axis,) = kinds
    sizes = {axis: world}
    layout = schema.Layout(dp=world if axis == DP else 1, tp=world if axis == TP else 1,
                           pp=world if axis == PP else 1)  # fmt: skip
    source = f"{FROM_GROUPS} (the world's only; " if listed else f"{INFERRED}: {NO_GROUPS}; "
    source += f"its only communication is {SHOWS[axis]}: {axis} spans every rank"
    source += ")" if listed else ""
    return FoundLayout(layout, grid_groups(sizes), source)


def name_by_placement(
    comms: list[dict[str, Any]], steps: list[dict[str, Any]], layout: schema.Layout
) -> None:
    """Each op no group names (an older trace's) given the axis its kind and size say, where
    the layout (given) has that axis and it is the only one the op can be: sends and receives
    the pipeline's; all-to-alls the experts'; all-reduces, all-gathers and reduce-scatters of
    the size the rank issues most often tensor parallel (every layer's activations, forward
    and backward), larger ones data parallel (the gradients' few buckets); the only axis of
    collectives where there is one. Without it, the n-th collective of every rank is matched
    as one (a tensor-parallel all-reduce with another stage's), and the replay reads noise.
    (Not the forward pass's placement, as for the layout: a later pipeline stage's first
    forward starts late in the step.)"""
    del steps  # the sizes decide here
    collective_axes = [a for a, n in ((TP, layout.tp), (DP, layout.dp)) if (n or 1) > 1]
    p2p_axis = PP if (layout.pp or 1) > 1 and (layout.cp or 1) == 1 else None
    a2a_axis = "ep" if (layout.ep or 1) > 1 and (layout.cp or 1) == 1 else None
    unnamed = [c for c in comms if not c.get("group") and not c.get("group_ranks")]
    sizes: dict[Any, Counter[float]] = defaultdict(Counter)
    for comm in unnamed:
        if comm.get("op") in ACTIVATION_OPS:
            sizes[comm.get("rank")][float(comm.get("bytes") or 0)] += 1
    for comm in unnamed:
        op = comm.get("op")
        if op in P2P_OPS:
            comm["group"] = p2p_axis
        elif op == "all_to_all":
            comm["group"] = a2a_axis
        elif op in COLLECTIVE_OPS and len(collective_axes) == 1:
            comm["group"] = collective_axes[0]
        elif op in ACTIVATION_OPS and collective_axes == [TP, DP]:
            counts = sizes[comm.get("rank")]
            activation = max(counts, key=lambda size: (counts[size], -size))
            size = float(comm.get("bytes") or 0)
            if activation > 0:  # sizes known (an older trace without `Input Dims` has none)
                comm["group"] = TP if size == activation else DP if size > activation else None
