"""The MoE layer in one process (the EP=1 path): capacity, routing, the dispatch plan on
hand-made routings, the aux loss, the skew injection, and the ep trainer's layout checks."""

from __future__ import annotations

import math

import pytest
import torch

from diag.metrics import compute_metrics
from diag.read.load import load_run
from reference_runs.config import TrainConfig
from reference_runs.ep import check_layout
from reference_runs.ep_comms import EpComm
from reference_runs.faults import FaultPlan
from reference_runs.model import GPT, GPTConfig
from reference_runs.moe import (
    MoELayer,
    expert_capacity,
    load_balancing_loss,
    plan_dispatch,
    route,
    skew_bias,
    to_moe,
)
from reference_runs.topology import Topology

CONFIG = GPTConfig(layers=2, hidden=32, heads=4, seq_len=8, vocab=64)


def test_capacity_is_the_ceiling_of_factor_tokens_topk_over_experts() -> None:
    assert expert_capacity(256, 2, 4, 1.25) == 160
    assert expert_capacity(64, 2, 4, 0.5) == 16
    assert expert_capacity(10, 1, 4, 1.0) == 3  # 2.5 -> 3
    assert expert_capacity(100, 2, 4, 1.1) == 55  # 55.000000000000007 in floating point


def test_route_picks_the_top_k_and_renormalises_the_gates() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 1.0]])
    two = route(logits, 2)
    assert two.experts.tolist() == [[0, 1], [2, 3]]
    torch.testing.assert_close(two.gates.sum(dim=-1), torch.ones(2))
    one = route(logits, 1)  # Switch: the gate is the router probability itself
    torch.testing.assert_close(one.gates.squeeze(1), logits.softmax(-1).max(-1).values)


def test_plan_serves_first_choices_before_second_choices_and_counts_drops() -> None:
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])  # (token, choice)
    plan = plan_dispatch(experts, num_experts=3, capacity=2)
    # expert 0 queue: t0, t1, t2 (first choices), then t3's second choice -> t2, t3 dropped
    # expert 1 queue: t3 (first), t0, t2 (second) -> t2 dropped; expert 2: t1 (second)
    assert plan.kept.tolist() == [[True, True], [True, True], [False, False], [True, False]]
    assert plan.routed.tolist() == [4, 3, 1]
    assert plan.send_counts.tolist() == [2, 2, 1]
    assert plan.dropped == 3
    assert plan.order.tolist() == [0, 2, 1, 6, 3]  # flat t*k+j, grouped by expert


def test_plan_splits_per_rank_sum_each_ranks_experts() -> None:
    experts = torch.tensor([[0], [1], [1], [2], [0], [1]])
    plan = plan_dispatch(experts, num_experts=4, capacity=10)
    assert plan.send_counts.tolist() == [2, 3, 1, 0] and plan.dropped == 0
    assert plan.rank_splits(2) == [5, 1]  # rank 0 holds experts 0-1, rank 1 experts 2-3
    assert plan.rank_splits(4) == [2, 3, 1, 0]
    assert plan.rank_splits(1) == [6]
    tight = plan_dispatch(experts, num_experts=4, capacity=1)
    assert tight.send_counts.tolist() == [1, 1, 1, 0] and tight.dropped == 3
    assert tight.kept.squeeze(1).tolist() == [True, True, False, True, False, False]


def test_aux_loss_is_one_for_a_uniform_router_and_e_when_collapsed() -> None:
    uniform = torch.full((8, 4), 0.25)
    balanced = torch.arange(8).remainder(4).unsqueeze(1)
    assert load_balancing_loss(uniform, balanced).item() == pytest.approx(1.0)
    # with uniform probabilities any assignment gives 1: sum_e f_e = 1
    assert load_balancing_loss(uniform, torch.zeros(8, 1, dtype=torch.long)).item() == 1.0
    collapsed = torch.zeros(8, 4)
    collapsed[:, 0] = 1.0
    assert load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long)).item() == 4.0
    top2 = torch.stack([balanced.squeeze(1), (balanced.squeeze(1) + 1) % 4], dim=1)
    assert load_balancing_loss(uniform, top2).item() == pytest.approx(1.0)


@pytest.mark.parametrize("frac", [0.0, 0.3, 0.7, 1.0])
def test_skew_bias_makes_the_hot_expert_first_choice_of_frac_of_the_tokens(frac: float) -> None:
    logits = torch.randn(4000, 4, generator=torch.Generator().manual_seed(0))
    bias = skew_bias(logits, 2, frac, torch.Generator().manual_seed(1))
    assert (bias[:, [0, 1, 3]] == 0).all()
    share = (route(logits + bias, 1).experts.squeeze(1) == 2).float().mean().item()
    assert share == pytest.approx(frac, abs=0.03)


def test_skew_at_follows_skew_and_growth() -> None:
    assert FaultPlan.from_specs([], 0).skew_at(3, 4) is None
    assert FaultPlan.from_specs(["skew:frac=0.7,expert=2"], 0).skew_at(5, 4) == (2, 0.7)
    growth = FaultPlan.from_specs(["skew-growth:per_step=0.25"], 0)
    assert [growth.skew_at(s, 4) for s in range(4)] == [(0, 0.25), (0, 0.5), (0, 0.75), (0, 1.0)]
    both = FaultPlan.from_specs(["skew:frac=0.5,expert=1", "skew-growth:per_step=0.1"], 0)
    hot, frac = both.skew_at(2, 4) or (None, None)
    assert hot == 1 and frac == pytest.approx(0.7)


def test_one_expert_top1_layer_is_that_experts_mlp() -> None:
    layer = MoELayer(CONFIG, num_experts=1, topk=1, capacity_factor=1.0, layer=0)
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(layer(x), layer.experts[0](x))
    assert layer.stats.routed.tolist() == [16] and layer.stats.dropped.item() == 0
    assert layer.aux_loss is not None and layer.aux_loss.item() == pytest.approx(1.0)


def test_tokens_over_capacity_get_no_expert_output() -> None:
    layer = MoELayer(CONFIG, num_experts=2, topk=1, capacity_factor=0.5, layer=0)
    layer.skew = (0, 1.0)  # every token's first choice is expert 0
    x = torch.randn(1, 8, 32)
    y = layer(x).view(8, 32)
    capacity = expert_capacity(8, 1, 2, 0.5)
    assert capacity == 2 and layer.stats.routed.tolist() == [8, 0]
    assert layer.stats.dropped.item() == 8 - capacity
    assert (y[capacity:] == 0).all() and (y[:capacity] != 0).any()


def test_expert_weights_do_not_depend_on_the_ep_degree() -> None:
    whole = MoELayer(CONFIG, 4, 2, 1.25, layer=1, seed=3)
    stub = EpComm(group=None, size=2, rank=1, rec=None, expected_bytes=0)
    half = MoELayer(CONFIG, 4, 2, 1.25, layer=1, comm=stub, seed=3)
    assert len(half.experts) == 2 and half.first_expert == 2
    torch.testing.assert_close(half.router.weight, whole.router.weight)
    for mine, theirs in zip(half.experts, list(whole.experts)[2:], strict=True):
        torch.testing.assert_close(mine.fc.weight, theirs.fc.weight)
    assert not torch.equal(whole.experts[0].fc.weight, whole.experts[1].fc.weight)
    with pytest.raises(ValueError, match=r"--experts \(3\) must be divisible by ep \(2\)"):
        MoELayer(CONFIG, 3, 1, 1.25, layer=0, comm=stub)


def test_moe_gpt_trains_every_parameter_and_its_aux_loss_starts_near_one() -> None:
    torch.manual_seed(0)
    gpt = GPT(CONFIG)
    layers = to_moe(gpt, num_experts=4, topk=2, capacity_factor=2.0)
    idx = torch.randint(64, (4, 9), generator=torch.Generator().manual_seed(0))
    _, loss = gpt(idx[:, :-1], idx[:, 1:])
    aux = torch.stack([layer.aux_loss for layer in layers if layer.aux_loss is not None]).sum()
    assert loss is not None and math.isfinite(loss.item())
    assert aux.item() / len(layers) == pytest.approx(1.0, abs=0.1)
    (loss + 0.01 * aux).backward()
    missing = [n for n, p in gpt.named_parameters() if p.grad is None]
    assert not missing
    assert all(layer.stats.routed.sum().item() == 4 * 8 * 2 for layer in layers)


def test_layout_checks_name_the_offending_values() -> None:
    plan = FaultPlan.from_specs([], 0)
    with pytest.raises(ValueError, match=r"--experts \(6\) must be divisible by ep \(4\)"):
        check_layout(TrainConfig(experts=6), Topology(4, ep=4), plan)
    with pytest.raises(ValueError, match="ep x dp only"):
        check_layout(TrainConfig(), Topology(4, ep=2, tp=2), plan)
    hot = FaultPlan.from_specs(["skew:frac=0.5,expert=4"], 0)
    with pytest.raises(ValueError, match="skew expert 4"):
        check_layout(TrainConfig(experts=4), Topology(2, ep=2), hot)
    check_layout(TrainConfig(experts=8), Topology(4, ep=2, dp=2), plan)


def test_experts_table_shows_the_drift_from_first_to_last_analysed_step(runs) -> None:
    rows = [
        *runs.simple_rank(4),
        runs.experts(0, 0, [9, 9, 9, 9], dropped=9),  # warm-up: ignored
        runs.experts(1, 0, [10, 10, 10, 10], dropped=0),
        runs.experts(2, 0, [20, 10, 5, 5], dropped=4),
        runs.experts(3, 0, [34, 2, 2, 2], dropped=10),
    ]
    (layer,) = compute_metrics(load_run(runs.write({0: rows}, runs.manifest(1)))).experts.to_dict(
        "records"
    )
    assert layer["max_over_mean"] == pytest.approx(64 / 30)
    assert (layer["max_over_mean_first"], layer["max_over_mean_last"]) == (1.0, 3.4)
    assert (layer["drop_rate_first"], layer["drop_rate_last"]) == (0.0, 0.25)
