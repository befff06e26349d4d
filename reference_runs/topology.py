"""The rank grid: which ranks form each data/tensor/pipeline/expert parallel group.

One grid, from which every group is derived (as picotron's `arange(world).view(dp, pp, cp, tp)`),
validated like torchtitan's `ParallelDims`. The axis order, outermost first, is

    dp, pp, ep, tp        rank = ((dp_i * pp + pp_i) * ep + ep_i) * tp + tp_i

so TP ranks are adjacent (same node when TP <= GPUs per node), EP next, PP across nodes, and DP
over what remains: the 3D layout rule "TP/EP intra-node -> PP across nodes -> DP over the rest".
Pure Python, usable without torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from diag.contract.names import GRID_AXES, WORLD, Axis, host_name

AXES = GRID_AXES  # grid order, outermost first


@dataclass(frozen=True)
class Topology:
    world_size: int  # total number of ranks
    dp: int = 1  # data-parallel degree
    tp: int = 1  # tensor-parallel degree
    pp: int = 1  # pipeline-parallel degree (stages)
    ep: int = 1  # expert-parallel degree (its own axis: dp * tp * pp * ep == world_size)
    gpus_per_node: int | None = None  # ranks per (virtual) host; None = hosts unknown

    def __post_init__(self) -> None:
        sizes = {"world_size": self.world_size}
        sizes.update((str(axis), size) for axis, size in self.sizes().items())
        bad = {name: size for name, size in sizes.items() if size < 1}
        if bad:
            raise ValueError(f"parallel sizes must be >= 1, got {bad}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        product = self.dp * self.tp * self.pp * self.ep
        if product != self.world_size:
            raise ValueError(
                f"dp({self.dp}) * tp({self.tp}) * pp({self.pp}) * ep({self.ep}) = {product} "
                f"!= world_size({self.world_size})"
            )

    @classmethod
    def from_sizes(
        cls,
        world_size: int,
        dp: int | None = None,
        tp: int | None = None,
        pp: int | None = None,
        ep: int | None = None,
        default_axis: Axis = "dp",
        gpus_per_node: int | None = None,
    ) -> Topology:
        """Sizes not given are 1, except `default_axis`, which takes the rest of the world."""
        if default_axis not in AXES:
            raise ValueError(f"default_axis must be one of {AXES}, got {default_axis!r}")
        given: dict[str, int | None] = {"dp": dp, "tp": tp, "pp": pp, "ep": ep}
        sizes = {axis: (1 if size is None else size) for axis, size in given.items()}
        if given[default_axis] is None:
            others = 1
            for axis, size in sizes.items():
                if axis != default_axis:
                    others *= size
            if others < 1 or world_size % others != 0:
                fixed = {a: s for a, s in given.items() if s is not None}
                raise ValueError(
                    f"world_size {world_size} is not divisible by the product {others} of the "
                    f"given sizes {fixed}, so {default_axis} cannot take the rest"
                )
            sizes[default_axis] = world_size // others
        return cls(world_size=world_size, gpus_per_node=gpus_per_node, **sizes)

    def sizes(self) -> dict[Axis, int]:
        """Size of each axis, in grid order."""
        return {"dp": self.dp, "pp": self.pp, "ep": self.ep, "tp": self.tp}

    def _check_axis(self, axis: str) -> Axis:
        for known in AXES:
            if axis == known:
                return known
        raise ValueError(f"unknown axis {axis!r}; expected one of {AXES}")

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world_size {self.world_size}")

    def rank_at(self, coords: dict[Axis, int]) -> int:
        """The rank at grid coordinates (the inverse of `coords`)."""
        rank = 0
        for axis, size in self.sizes().items():
            rank = rank * size + coords[axis]
        return rank

    def coords(self, rank: int) -> dict[Axis, int]:
        """Grid coordinates of `rank`, e.g. {'dp': 1, 'pp': 0, 'ep': 0, 'tp': 1}."""
        self._check_rank(rank)
        out: dict[Axis, int] = {}
        for axis in reversed(AXES):  # peel off the innermost axis first
            size = self.sizes()[axis]
            out[axis] = rank % size
            rank //= size
        return {axis: out[axis] for axis in AXES}

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of `axis`: ranks that differ only in that coordinate, each sorted."""
        axis = self._check_axis(axis)
        sizes = self.sizes()
        others = [a for a in AXES if a != axis]
        result = []
        for fixed in itertools.product(*(range(sizes[a]) for a in others)):
            base = dict(zip(others, fixed, strict=True))
            result.append(sorted(self.rank_at({**base, axis: i}) for i in range(sizes[axis])))
        return sorted(result)

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The group of `axis` that contains `rank`."""
        axis = self._check_axis(axis)
        base = self.coords(rank)
        return sorted(self.rank_at({**base, axis: i}) for i in range(self.sizes()[axis]))

    def all_groups(self) -> dict[str, list[list[int]]]:
        """Groups for the run manifest: every axis of size > 1, plus 'world'."""
        out: dict[str, list[list[int]]] = {
            axis: self.groups(axis) for axis, size in self.sizes().items() if size > 1
        }
        out[WORLD] = [list(range(self.world_size))]
        return out

    def host_of(self, rank: int) -> str | None:
        """Virtual host of `rank` ("node<rank // gpus_per_node>"), or None if hosts are unknown."""
        self._check_rank(rank)
        if self.gpus_per_node is None:
            return None
        return host_name(rank, self.gpus_per_node)

    def spans_hosts(self, axis: str) -> bool:
        """True if some group of `axis` holds ranks on different hosts (False if hosts unknown)."""
        if self.gpus_per_node is None:
            return False
        return any(len({self.host_of(r) for r in group}) > 1 for group in self.groups(axis))
