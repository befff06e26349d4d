"""Names that the trainers, the simulator, the collectors and the analysis must spell alike.

Group names are the parallel dimensions (docs/cli.md); a collective's `tag` says which part of the
model issued it. A name that a writer spells here and a reader matches here cannot drift apart.
Standard library only: the collectors import `diag` inside training processes.
"""

from __future__ import annotations

from typing import Final, Literal

# --- Process groups ------------------------------------------------------------------------------

DP: Final = "dp"
TP: Final = "tp"
PP: Final = "pp"
EP: Final = "ep"
WORLD: Final = "world"
PARALLEL_GROUPS = (DP, TP, PP, EP)
"""The parallel dimensions a collective's group can be named after (plus `WORLD`)."""

Axis = Literal["dp", "pp", "ep", "tp"]
GRID_AXES: tuple[Axis, ...] = (DP, PP, EP, TP)
"""The rank grid's axes, outermost first: rank = ((dp_i * pp + pp_i) * ep + ep_i) * tp + tp_i."""
CP: Final = "cp"
"""Context parallelism: a trace folder's axis (read from its rings or all-to-alls, or given by
`--layout cp=N`), which the trainers and the simulator do not run."""
_GRID_ORDER = (DP, PP, EP, CP, TP)
"""The grid with context parallelism, just outside tensor parallelism (as Megatron-LM's
`tp-cp-ep-dp-pp` order keeps it next to tp); cp = 1 leaves GRID_AXES' grid as it is."""


def grid_groups(
    sizes: dict[str, int], order: tuple[str, ...] = _GRID_ORDER
) -> dict[str, list[list[int]]]:
    """The groups of each axis of size > 1 (every rank list with only that axis varying,
    sorted) and the world, for the axes' sizes in GRID_AXES order (`{"dp": 2, "pp": 4, ...}`;
    a missing axis is 1; `cp` just outside tp): what a job laid out on this grid forms.
    `order`: another grid's, outermost first (axes it leaves out are of size 1)."""
    shape = [max(int(sizes.get(axis, 1)), 1) for axis in order]
    world = 1
    for size in shape:
        world *= size
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    out: dict[str, list[list[int]]] = {}
    for axis, (size, stride) in enumerate(zip(shape, strides, strict=True)):
        if size < 2:
            continue
        starts = [r for r in range(world) if (r // stride) % size == 0]
        groups = [[start + i * stride for i in range(size)] for start in starts]
        out[order[axis]] = sorted(groups)
    out[WORLD] = [list(range(world))]
    return out


def host_name(rank: int, gpus_per_node: int) -> str:
    """The virtual host of `rank` when `gpus_per_node` ranks share a host (`--gpus-per-node`)."""
    return f"node{rank // gpus_per_node}"


# --- Trainers and pipeline schedules -------------------------------------------------------------

TRAINERS = ("dp", "tp", "pp", "ep", "zero3")
"""The reference trainers (`diag run TRAINER`, the manifest's `trainer`; `custom` for others)."""
SCHEDULES = ("1f1b", "gpipe", "interleaved")
"""Pipeline schedules (`--schedule`): diag/contract/schedules.py orders each stage's actions."""

# --- Collective tags -----------------------------------------------------------------------------

TP_BLOCKS = ("attn", "mlp")
"""The parts of a transformer block whose tensor-parallel collectives carry the layer."""
TP_LAYER_TAG = r"^tp\.(?:attn|mlp)\.(fwd|bwd)$"
"""Matches `tp_tag(block, direction)` for a block of `TP_BLOCKS`; group 1 is the direction."""


def tp_tag(place: str, direction: Literal["fwd", "bwd"]) -> str:
    """The tag of a tensor-parallel collective: `tp.<place>.<fwd|bwd>`, where `place` is `attn`
    or `mlp` inside a layer, `embed` or `head` around the stack (sequence parallelism)."""
    return f"tp.{place}.{direction}"


EP_DISPATCH: Final = "dispatch"
"""The all-to-all that sends the tokens to their experts' ranks."""
EP_COMBINE: Final = "combine"
"""The all-to-all that brings the experts' outputs back to the tokens' ranks."""


def backward_tag(tag: str) -> str:
    """The tag of the collective that a recorded forward collective becomes in backward."""
    return f"{tag}.bwd"


EP_ALLTOALL_TAGS = (EP_DISPATCH, EP_COMBINE, backward_tag(EP_DISPATCH), backward_tag(EP_COMBINE))
"""The expert-parallel token all-to-alls (not `splits`, the exchange of their sizes)."""
