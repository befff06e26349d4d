"""Expert routing of the simulated MoE layers: counts per expert, capacity, drops, aux loss.

Each EP rank routes its micro-batch's T tokens to `topk` experts (a multinomial draw over the
layer's router preference, a seeded Dirichlet close to uniform). Under `skew` the hot expert is
the first choice of a share F of the tokens (their other choices go elsewhere), as the ep
trainer's skew bias does. An expert keeps at most `capacity = ceil(factor x T x topk / E)` of
one rank's assignments (Switch Transformer); the rest are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PREFERENCE_CONCENTRATION = 50.0
"""Dirichlet concentration of a layer's router preference: max/mean load ~1.2 at 8 experts."""


def expert_capacity(tokens: int, topk: int, experts: int, factor: float) -> int:
    """Slots per expert for one rank's micro-batch (reference_runs/moe.py)."""
    return math.ceil(round(factor * tokens * topk / experts, 9))


@dataclass(frozen=True)
class Routing:
    """One MoE layer's routing for one micro-batch on every EP rank of a stage."""

    routed: np.ndarray  # (dp, ep, E) assignments each source rank routes to each expert
    kept: np.ndarray  # (dp, ep, E) of them within capacity

    def send_rows(self) -> np.ndarray:
        """(dp, ep) rows each rank sends in the dispatch (its kept assignments)."""
        return self.kept.sum(axis=-1)

    def recv_rows(self, ep: int) -> np.ndarray:
        """(dp, ep) rows each rank receives: the kept assignments of its experts, all sources."""
        dp, _, experts = self.kept.shape
        return self.kept.reshape(dp, ep, ep, experts // ep).sum(axis=(1, 3))


def route(
    rng: np.random.Generator,
    shape: tuple[int, int],
    tokens: int,
    topk: int,
    preference: np.ndarray,
    capacity: int,
    skew: tuple[int, float] | None,
) -> Routing:
    """Draw the routing of `tokens` per rank for ranks of `shape` (dp, ep)."""
    if skew is None:
        routed = rng.multinomial(tokens * topk, preference, size=shape)
    else:
        hot, frac = skew
        first = rng.binomial(tokens, frac, size=shape)  # tokens whose first choice is `hot`
        others = preference.copy()
        others[hot] = 0.0
        others /= others.sum()
        routed = rng.multinomial(first * (topk - 1), others)
        routed += rng.multinomial((tokens - first) * topk, preference)
        routed[..., hot] += first
    return Routing(routed, np.minimum(routed, capacity))


def aux_loss(routed: np.ndarray) -> float:
    """Switch's load-balancing loss E x sum_e f_e x P_e (1 when balanced, E when collapsed),
    f_e the share of the assignments routed to expert e (last axis); the router's mean
    probability P_e is taken equal to f_e."""
    total = routed.sum()
    if total <= 0:
        return 1.0
    share = routed.reshape(-1, routed.shape[-1]).sum(axis=0) / total
    return float(routed.shape[-1] * (share * share).sum())
