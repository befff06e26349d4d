"""When no layout fits: the least memory per GPU any layout needs, by category, against the
device's memory, and the nearest misses (the layouts over the budget by the fewest bytes).

"0 feasible" alone says nothing a user can act on; this says how far the model is from
fitting and where the bytes go (state: more GPUs or ZeRO; activations: recomputation, a
smaller micro-batch or CP), and which layouts come closest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diag.plan.evaluate import Evaluation

NEAREST_MISSES = 5


@dataclass(frozen=True)
class NoFit:
    """Why nothing is feasible, in memory terms."""

    budget_bytes: float  # the device's memory
    least: Evaluation  # the layout that needs the least memory per GPU
    floor_bytes: dict[str, float]  # each category's least over every layout (not one layout)
    misses: list[Evaluation]  # memory-rejected meshes' leanest variants, least over first

    @property
    def fits_elsewhere(self) -> bool:
        """Some layout fits in memory and is rejected for another reason (TP across nodes)."""
        return self.least.memory.total_bytes <= self.budget_bytes


def no_fit(
    evaluated: Sequence[Evaluation], budget_bytes: float, count: int = NEAREST_MISSES
) -> NoFit | None:
    """The memory summary of a plan with no feasible layout; None when there is one, or
    when nothing could be built (there is no memory to speak of). The misses are the
    `count` meshes (dp, tp, pp, cp, ep) whose leanest variant is over by the least."""
    if not evaluated or any(e.feasible for e in evaluated):
        return None
    least = min(evaluated, key=lambda e: e.memory.total_bytes)
    categories = [k for k in least.memory.as_dict() if k != "total"]
    floor = {k: min(e.memory.as_dict()[k] for e in evaluated) for k in categories}
    over = sorted(
        (e for e in evaluated if e.rejected_kind == "memory"),
        key=lambda e: (e.memory.total_bytes, e.step_s),
    )
    # one per mesh: its v, ZeRO and recompute variants would fill the list with one mesh
    seen: set[tuple[int, ...]] = set()
    misses: list[Evaluation] = []
    for e in over:
        mesh = (e.layout.dp, e.layout.tp, e.layout.pp, e.layout.cp, e.layout.ep)
        if mesh not in seen and len(misses) < count:
            seen.add(mesh)
            misses.append(e)
    return NoFit(budget_bytes, least, floor, misses)
