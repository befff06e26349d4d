"""The mixture-of-experts feed-forward layer of the ep trainer: top-k router, expert capacity,
load-balancing loss, dispatch and combine over the expert-parallel group.

Lepikhin et al., "GShard" (arXiv 2006.16668), section 2.2 and Algorithm 1: top-2 gating with the
gates renormalised over the chosen experts, an expert capacity per group of tokens, and a
position in each expert's queue that serves every token's first choice before any second
choice. Fedus et al., "Switch Transformer" (arXiv 2101.03961), section 2.2: the capacity factor
(`capacity = factor x tokens x topk / experts`) and the auxiliary loss `E x sum_e f_e x P_e`.

One layer on this rank's T tokens (a "group" is this rank's micro-batch):
    route      router softmax -> top-k experts and gates per token
    plan       each (token, choice) gets a position in its expert's queue; positions at or
               beyond the capacity are dropped (the block's residual carries the token on)
    dispatch   the kept assignments, sorted by expert, go to their experts' ranks (all-to-all)
    experts    each of this rank's `experts / ep` MLPs runs on its rows
    combine    the outputs come back (all-to-all) and are summed per token, weighted by gates
Experts are contiguous: EP rank r holds experts r x E/ep .. (r+1) x E/ep - 1. Each expert's
weights come from a seed of its own, so a model is the same function whatever the ep degree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from diag.contract.names import EP_COMBINE, EP_DISPATCH
from reference_runs.ep_comms import AllToAll, EpComm
from reference_runs.model import GPT, MLP, GPTConfig

SKEW_MARGIN = 4.0
"""Logit lead the `skew` injection gives the hot expert over the best other one (~55x the odds)."""


def expert_capacity(tokens: int, topk: int, experts: int, factor: float) -> int:
    """Slots per expert for one group of `tokens`: ceil(factor x tokens x topk / experts)."""
    return math.ceil(round(factor * tokens * topk / experts, 9))


@dataclass
class Routing:
    probs: torch.Tensor  # (T, E) router softmax
    experts: torch.Tensor  # (T, k) chosen experts, best first
    gates: torch.Tensor  # (T, k) combine weights: renormalised over the k (GShard), p for k = 1


def route(logits: torch.Tensor, topk: int) -> Routing:
    probs = logits.softmax(dim=-1)
    top, experts = probs.topk(topk, dim=-1)
    gates = top / top.sum(dim=-1, keepdim=True) if topk > 1 else top
    return Routing(probs, experts, gates)


def skew_bias(
    logits: torch.Tensor, expert: int, frac: float, generator: torch.Generator
) -> torch.Tensor:
    """A constant (T, E) bias that makes `expert` the first choice of a random `frac` of the
    tokens (SKEW_MARGIN above the best other logit) and of none of the others (its logit is
    held just below the best other one there, so it can still be their second choice)."""
    logits = logits.detach()
    if logits.shape[1] < 2:
        return torch.zeros_like(logits)
    others = logits.clone()
    others[:, expert] = float("-inf")
    best_other = others.max(dim=-1).values
    draw = torch.rand(logits.shape[0], generator=generator).to(logits.device)
    hot = logits[:, expert]
    demoted = torch.minimum(hot, best_other - 0.01)  # just below: it stays a likely second
    target = torch.where(draw < frac, best_other + SKEW_MARGIN, demoted)
    bias = torch.zeros_like(logits)
    bias[:, expert] = target - hot
    return bias


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch's auxiliary loss (eq. 4) for top-k: E x sum_e f_e x P_e, f_e the share of the
    T x k assignments routed to e (no gradient), P_e the mean router probability of e.
    1 for a balanced router, E when every token goes to one expert."""
    num_experts = probs.shape[1]
    counts = torch.bincount(experts.flatten(), minlength=num_experts).to(probs.dtype)
    return num_experts * (counts / experts.numel() * probs.mean(dim=0)).sum()


@dataclass
class DispatchPlan:
    routed: torch.Tensor  # (E,) assignments routed to each expert, before capacity
    kept: torch.Tensor  # (T, k) bool: the assignment is within its expert's capacity
    order: torch.Tensor  # (n,) kept assignments as flat indices t x k + j, sorted by expert
    send_counts: torch.Tensor  # (E,) kept assignments per expert (the dispatch's rows)
    capacity: int

    @property
    def dropped(self) -> int:
        return int(self.routed.sum() - self.send_counts.sum())

    def rank_splits(self, ep: int) -> list[int]:
        """Rows sent to each EP rank: the kept assignments of its experts."""
        return [int(n) for n in self.send_counts.view(ep, -1).sum(dim=1)]


def plan_dispatch(experts: torch.Tensor, num_experts: int, capacity: int) -> DispatchPlan:
    """Which assignments of a (T, k) routing fit in `capacity` slots per expert, and the order
    they are sent in. Queue positions count every first choice (in token order) before any
    second choice, as GShard's Algorithm 1 does."""
    tokens, topk = experts.shape
    choice_major = experts.t().reshape(-1)
    onehot = F.one_hot(choice_major, num_experts)
    position = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) - 1
    kept = (position < capacity).view(topk, tokens).t()
    flat = experts.reshape(-1)
    index = kept.reshape(-1).nonzero().squeeze(1)
    order = index[torch.argsort(flat[index], stable=True)]
    return DispatchPlan(
        routed=torch.bincount(flat, minlength=num_experts),
        kept=kept,
        order=order,
        send_counts=torch.bincount(flat[order], minlength=num_experts),
        capacity=capacity,
    )


@dataclass
class RoutingStats:
    """What one layer routed since the last reset (the trainer resets it every step)."""

    routed: torch.Tensor  # (E,) assignments per expert before capacity, summed
    dropped: torch.Tensor  # () dropped assignments, summed
    aux_loss: torch.Tensor  # () sum of the unweighted aux loss over forward calls
    calls: int = 0  # forward calls (micro-batches)
    capacity: int | None = field(default=None)  # slots per expert of the last call

    @classmethod
    def zeros(cls, num_experts: int, device: torch.device | None = None) -> RoutingStats:
        z = torch.zeros((), dtype=torch.float64, device=device)
        return cls(torch.zeros(num_experts, dtype=torch.int64, device=device), z, z.clone())


def _seeded_linear_init(module: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            with torch.no_grad():
                sub.weight.copy_(torch.randn(sub.weight.shape, generator=gen) * 0.02)
                if sub.bias is not None:
                    sub.bias.zero_()


class MoELayer(nn.Module):
    """Drop-in for a `Block.mlp`: the router and this rank's `experts / ep` expert MLPs."""

    def __init__(
        self, config: GPTConfig, num_experts: int, topk: int, capacity_factor: float,
        layer: int, comm: EpComm | None = None, seed: int = 0,
    ) -> None:  # fmt: skip
        super().__init__()
        ep, ep_rank = (comm.size, comm.rank) if comm is not None else (1, 0)
        if num_experts % ep:
            raise ValueError(f"--experts ({num_experts}) must be divisible by ep ({ep})")
        if not 1 <= topk <= num_experts:
            raise ValueError(f"--topk ({topk}) must be in 1..--experts ({num_experts})")
        self.num_experts, self.topk, self.capacity_factor = num_experts, topk, capacity_factor
        self.layer, self.comm, self.ep = layer, comm, ep
        self.num_local = num_experts // ep
        self.first_expert = ep_rank * self.num_local
        self.router = nn.Linear(config.hidden, num_experts, bias=False)
        _seeded_linear_init(self.router, seed * 100_003 + layer)
        self.experts = nn.ModuleList()
        for e in range(self.first_expert, self.first_expert + self.num_local):
            expert = MLP(config)
            _seeded_linear_init(expert, seed * 100_003 + (layer + 1) * 1_009 + e)
            self.experts.append(expert)
        self.skew: tuple[int, float] | None = None  # (hot expert, share of first choices)
        self._skew_rng = torch.Generator().manual_seed(seed * 7_919 + layer * 31 + ep_rank)
        self.aux_loss: torch.Tensor | None = None  # of the last forward, with its graph
        self.stats = RoutingStats.zeros(num_experts)

    def reset_stats(self) -> None:
        self.stats = RoutingStats.zeros(self.num_experts, self.router.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.router(tokens)
        if self.skew is not None:
            logits = logits + skew_bias(logits, *self.skew, generator=self._skew_rng)
        routing = route(logits, self.topk)
        capacity = expert_capacity(
            tokens.shape[0], self.topk, self.num_experts, self.capacity_factor
        )
        plan = plan_dispatch(routing.experts, self.num_experts, capacity)
        self.aux_loss = load_balancing_loss(routing.probs, routing.experts)
        self._count(plan, self.aux_loss)
        token_of = plan.order // self.topk
        rows = self._run_experts(tokens[token_of], plan)
        weighted = rows * routing.gates.reshape(-1)[plan.order].unsqueeze(1)
        return torch.zeros_like(tokens).index_add(0, token_of, weighted).view_as(x)

    def _count(self, plan: DispatchPlan, aux_loss: torch.Tensor) -> None:
        s = self.stats
        s.routed = s.routed + plan.routed.to(s.routed.device)
        s.dropped = s.dropped + (plan.routed.sum() - plan.send_counts.sum()).to(s.dropped)
        s.aux_loss = s.aux_loss + aux_loss.detach().to(s.aux_loss)
        s.calls += 1
        s.capacity = plan.capacity

    def _local(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows grouped by local expert, `counts[i]` rows for expert i -> their outputs."""
        chunks = rows.split(counts)
        return torch.cat([expert(c) for expert, c in zip(self.experts, chunks, strict=True)])

    def _run_experts(self, send: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        """The kept rows, sorted by expert -> the experts' outputs in the same order."""
        if self.comm is None:
            return self._local(send, plan.send_counts.tolist())
        comm, layer = self.comm, self.layer
        recv_counts = comm.exchange_counts(plan.send_counts, layer)  # (source rank, local expert)
        in_splits, out_splits = plan.rank_splits(self.ep), recv_counts.sum(dim=1).tolist()
        recv = AllToAll.apply(send, comm, out_splits, in_splits, EP_DISPATCH, layer)
        # rows arrive by source rank, each source's rows by local expert: regroup by expert
        expert_of_row = torch.arange(self.num_local, device=recv.device).repeat(self.ep)
        expert_of_row = expert_of_row.repeat_interleave(recv_counts.flatten().to(recv.device))
        by_expert = torch.argsort(expert_of_row, stable=True)
        out = self._local(recv[by_expert], recv_counts.sum(dim=0).tolist())
        back = out[torch.argsort(by_expert)]  # the arrival order again
        return AllToAll.apply(back, comm, in_splits, out_splits, EP_COMBINE, layer)


def to_moe(
    gpt: GPT, num_experts: int, topk: int, capacity_factor: float,
    comm: EpComm | None = None, seed: int = 0,
) -> list[MoELayer]:  # fmt: skip
    """Replace every block's MLP of `gpt` by a MoE layer (in place); the new layers."""
    layers = []
    for index, block in enumerate(gpt.blocks):
        block.mlp = MoELayer(gpt.config, num_experts, topk, capacity_factor, index, comm, seed)
        layers.append(block.mlp)
    return layers
