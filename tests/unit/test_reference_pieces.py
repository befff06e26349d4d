"""Unit tests for the shared pieces of the reference trainers (pure CPU, no process group)."""

from __future__ import annotations

import itertools
import shlex

import pytest
import torch

from diag.contract.injections import (
    Jitter,
    LoaderStall,
    MemoryLeak,
    NoSetEpoch,
    Skew,
    SkewGrowth,
    SlowComm,
    Slowdown,
    StageSlow,
    Straggler,
    parse_injection,
)
from reference_runs.config import TrainConfig, parse_config
from reference_runs.data import SyntheticTokens, iterate_batches, make_loader
from reference_runs.faults import FaultPlan, Leak
from reference_runs.model import GPT, MLP, Block, CausalSelfAttention, GPTConfig, count_params
from reference_runs.topology import Topology

# ---------------------------------------------------------------- model


def test_gpt_forward_shapes_and_loss() -> None:
    torch.manual_seed(0)
    config = GPTConfig(layers=2, hidden=32, heads=4, seq_len=16, vocab=64)
    model = GPT(config)
    idx = torch.randint(64, (3, 16))
    logits, loss = model(idx)
    assert logits.shape == (3, 16, 64)
    assert loss is None
    logits, loss = model(idx, targets=idx)
    assert loss is not None and loss.ndim == 0
    assert abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.5  # ~uniform at init


def test_gpt_structure_and_tied_head() -> None:
    model = GPT(GPTConfig(layers=3, hidden=32, heads=2, seq_len=8, vocab=40))
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) == 3
    block = model.blocks[0]
    assert isinstance(block, Block)
    assert isinstance(block.attn, CausalSelfAttention) and isinstance(block.mlp, MLP)
    assert model.lm_head.weight is model.tok_emb.weight
    assert block.mlp.fc.out_features == 4 * 32


def test_gpt_is_causal() -> None:
    model = GPT(GPTConfig(layers=1, hidden=16, heads=2, seq_len=8, vocab=20)).eval()
    idx = torch.randint(20, (1, 8))
    changed = idx.clone()
    changed[0, 5] = (idx[0, 5] + 1) % 20
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.allclose(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_count_params_counts_tied_weight_once() -> None:
    model = GPT(GPTConfig(layers=2, hidden=32, heads=4, seq_len=16, vocab=64, ffn_hidden=48))
    unique = {id(p): p for p in model.parameters()}
    assert count_params(model) == sum(p.numel() for p in unique.values())
    assert count_params(model) < sum(
        p.numel() for _, p in model.named_parameters(remove_duplicate=False)
    )


def test_gpt_config_validation() -> None:
    with pytest.raises(ValueError, match=r"hidden \(30\).*heads \(4\)"):
        GPTConfig(hidden=30, heads=4)
    with pytest.raises(ValueError, match="layers"):
        GPTConfig(layers=0)
    assert GPTConfig(hidden=64).ffn_hidden == 256


def test_training_reduces_loss_on_synthetic_data() -> None:
    torch.manual_seed(0)
    config = GPTConfig(layers=2, hidden=64, heads=4, seq_len=32, vocab=64)
    model = GPT(config)
    data = SyntheticTokens(num_samples=64, seq_len=32, vocab=64, seed=0)
    loader, sampler = make_loader(data, micro_batch=16, dp_rank=0, dp_size=1, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for x, y in itertools.islice(iterate_batches(loader, sampler, set_epoch=True), 30):
        _, loss = model(x, y)
        assert loss is not None
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


# ---------------------------------------------------------------- topology


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world_size": 8, "dp": 2, "tp": 2}, r"= 4 != world_size\(8\)"),
        ({"world_size": 4, "dp": 0, "tp": 4}, "'dp': 0"),
        ({"world_size": 0}, "'world_size': 0"),
        ({"world_size": 2, "dp": 2, "gpus_per_node": 0}, "gpus_per_node must be >= 1, got 0"),
    ],
)
def test_topology_validation(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Topology(**kwargs)


def test_topology_groups_world8() -> None:
    topo = Topology(world_size=8, dp=2, tp=2, pp=2)
    for axis in ("dp", "tp", "pp", "ep"):
        groups = topo.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(8)), axis
        assert all(g == sorted(g) for g in groups)
        for rank in range(8):
            assert topo.group_of(rank, axis) in groups
    assert topo.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # adjacent ranks
    assert topo.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert topo.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.groups("ep") == [[r] for r in range(8)]
    assert topo.coords(5) == {"dp": 1, "pp": 0, "ep": 0, "tp": 1}
    assert all(topo.rank_at(topo.coords(r)) == r for r in range(8))
    assert topo.group_of(5, "pp") == [5, 7]
    manifest_groups = topo.all_groups()
    assert set(manifest_groups) == {"dp", "tp", "pp", "world"}
    assert manifest_groups["world"] == [list(range(8))]


def test_topology_ep_axis_sits_between_pp_and_tp() -> None:
    topo = Topology(world_size=8, dp=2, ep=2, tp=2)
    assert topo.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    with pytest.raises(ValueError, match="unknown axis 'cp'"):
        topo.groups("cp")
    with pytest.raises(ValueError, match="rank 8 out of range"):
        topo.coords(8)


def test_topology_hosts() -> None:
    wide = Topology(world_size=8, dp=2, tp=4, gpus_per_node=2)
    narrow = Topology(world_size=8, dp=4, tp=2, gpus_per_node=2)
    assert [wide.host_of(r) for r in range(4)] == ["node0", "node0", "node1", "node1"]
    assert wide.spans_hosts("tp") and wide.spans_hosts("dp")
    assert not narrow.spans_hosts("tp") and narrow.spans_hosts("dp")
    unknown = Topology(world_size=4, tp=4)
    assert unknown.host_of(3) is None and not unknown.spans_hosts("tp")


def test_topology_from_sizes() -> None:
    assert Topology.from_sizes(8).dp == 8
    topo = Topology.from_sizes(8, tp=2, default_axis="pp")
    assert (topo.dp, topo.tp, topo.pp, topo.ep) == (1, 2, 4, 1)
    topo = Topology.from_sizes(8, dp=2, tp=2, pp=2, default_axis="tp")
    assert topo.tp == 2
    with pytest.raises(ValueError, match="world_size 8 is not divisible by the product 3"):
        Topology.from_sizes(8, tp=3)
    with pytest.raises(ValueError, match="!= world_size"):
        Topology.from_sizes(8, dp=2, tp=2)  # dp given, so nothing takes the rest


# ---------------------------------------------------------------- data


def test_synthetic_tokens_deterministic_and_shifted() -> None:
    a = SyntheticTokens(num_samples=10, seq_len=12, vocab=50, seed=3)
    b = SyntheticTokens(num_samples=10, seq_len=12, vocab=50, seed=3)
    c = SyntheticTokens(num_samples=10, seq_len=12, vocab=50, seed=4)
    x, y = a[2]
    assert x.shape == y.shape == (12,)
    assert torch.equal(x[1:], y[:-1])
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    # every transition follows the rule
    for prev, nxt in zip(x.tolist(), y.tolist(), strict=True):
        assert nxt in a.successors[prev].tolist()


def _epoch_orders(set_epoch: bool, dp_rank: int = 0, dp_size: int = 2) -> list[list[list[int]]]:
    data = SyntheticTokens(num_samples=32, seq_len=4, vocab=16, seed=0)
    loader, sampler = make_loader(data, micro_batch=4, dp_rank=dp_rank, dp_size=dp_size, seed=7)
    per_epoch = len(loader)
    batches = itertools.islice(iterate_batches(loader, sampler, set_epoch), 3 * per_epoch)
    rows = [row for x, _ in batches for row in x.tolist()]
    n = per_epoch * 4
    return [rows[i * n : (i + 1) * n] for i in range(3)]


def test_loader_is_deterministic_and_sharded() -> None:
    assert _epoch_orders(True) == _epoch_orders(True)
    rank0, rank1 = _epoch_orders(True, 0), _epoch_orders(True, 1)
    assert len(rank0[0]) == 16 and rank0[0] != rank1[0]


def test_set_epoch_reshuffles_and_no_set_epoch_repeats() -> None:
    with_set = _epoch_orders(set_epoch=True)
    assert with_set[0] != with_set[1] and with_set[1] != with_set[2]
    without = _epoch_orders(set_epoch=False)
    assert without[0] == without[1] == without[2]
    assert without[0] == with_set[0]  # epoch 0 is the same either way


def test_loader_validation() -> None:
    data = SyntheticTokens(num_samples=4, seq_len=4, vocab=16, seed=0)
    with pytest.raises(ValueError, match="dp_rank=2, dp_size=2"):
        make_loader(data, micro_batch=1, dp_rank=2, dp_size=2, seed=0)
    loader, sampler = make_loader(data, micro_batch=8, dp_rank=0, dp_size=1, seed=0)
    with pytest.raises(ValueError, match="no batches"):
        next(iterate_batches(loader, sampler, set_epoch=True))


# ---------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("straggler:rank=2,ms=50", Straggler(rank=2, ms=50.0)),
        ("slow-comm:ms=5", SlowComm(ms=5.0)),
        ("slow-comm:ms=5,group=tp", SlowComm(ms=5.0, group="tp")),
        ("skew:frac=0.8", Skew(frac=0.8)),
        ("skew:frac=0.5,expert=3", Skew(frac=0.5, expert=3)),
        ("skew-growth:per_step=0.05", SkewGrowth(per_step=0.05)),
        ("leak:mb=1.5", MemoryLeak(mb=1.5)),
        ("slowdown:ms=4", Slowdown(ms=4.0)),
        ("slowdown:ms=4,rank=1", Slowdown(ms=4.0, rank=1)),
        ("no-set-epoch", NoSetEpoch()),
        (" straggler: ms=1 , rank=0 ", Straggler(rank=0, ms=1.0)),
        ("stage-slow:stage=1,ms=5", StageSlow(stage=1, ms=5.0)),
        ("stage-slow:ms=0.5,stage=0", StageSlow(stage=0, ms=0.5)),
        ("jitter:ms=40", Jitter(ms=40.0)),
        ("loader-stall:rank=1,ms=40", LoaderStall(rank=1, ms=40.0)),
    ],
)
def test_parse_injection(spec: str, expected: object) -> None:
    assert parse_injection(spec) == expected


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("oops:ms=1", "unknown injection 'oops'"),
        ("", "unknown injection ''"),
        ("straggler:rank=1", "missing required key(s) ms"),
        ("straggler:ms=1,rank=1,extra=2", "unknown key 'extra'"),
        ("no-set-epoch:x=1", "unknown key 'x'"),
        ("straggler:rank=a,ms=1", "rank='a' is not an integer"),
        ("straggler:rank=1.5,ms=1", "is not an integer"),
        ("straggler:rank=-1,ms=1", "must be >= 0"),
        ("slow-comm:ms=fast", "is not a number"),
        ("slow-comm:ms=-3", "must be a finite number >= 0"),
        ("slow-comm:ms=nan", "must be a finite number >= 0"),
        ("slow-comm:ms=1,group=world", "must be one of dp|tp|pp|ep"),
        ("skew:frac=1.5", "must be in [0, 1]"),
        ("skew:frac=-0.1", "must be in [0, 1]"),
        ("skew-growth:per_step=2", "must be in [0, 1]"),
        ("leak:mb=-1", "must be a finite number >= 0"),
        ("leak:mb", "expected key=value"),
        ("leak:mb=1,mb=2", "given twice"),
        ("stage-slow:ms=5", "missing required key(s) stage"),
        ("stage-slow:stage=1", "missing required key(s) ms"),
        ("stage-slow:stage=-1,ms=5", "stage='-1' must be >= 0"),
        ("stage-slow:stage=1,ms=5,rank=0", "unknown key 'rank' for stage-slow"),
        ("jitter", "missing required key(s) ms"),
        ("jitter:ms=-2", "must be a finite number >= 0"),
        ("jitter:ms=inf", "must be a finite number >= 0"),
        ("jitter:ms=5,rank=1", "unknown key 'rank' for jitter (allowed: ms)"),
        ("loader-stall:ms=40", "missing required key(s) rank"),
        ("loader-stall:rank=x,ms=40", "rank='x' is not an integer"),
        ("loader-stall:rank=1,ms=slow", "ms='slow' is not a number"),
    ],
)
def test_parse_injection_errors(spec: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_injection(spec)
    message = str(info.value)
    assert repr(spec) in message and reason in message
    assert "\n" not in message


def test_fault_plan_per_rank() -> None:
    specs = ["straggler:rank=1,ms=20", "slow-comm:ms=3,group=dp", "slow-comm:ms=2", "leak:mb=2"]
    plan1, plan0 = FaultPlan.from_specs(specs, rank=1), FaultPlan.from_specs(specs, rank=0)
    assert plan1.compute_delay_s() == pytest.approx(0.02)
    assert plan0.compute_delay_s() == 0.0
    assert plan0.comm_delay_s("dp") == pytest.approx(0.005)
    assert plan0.comm_delay_s("tp") == pytest.approx(0.002)
    assert plan0.leak_bytes_per_step() == 2 * 2**20
    assert plan0.set_epoch and plan0.skew is None and plan0.skew_growth is None
    assert plan0.specs == tuple(specs)
    skewed = FaultPlan.from_specs(["skew:frac=0.9,expert=1", "skew-growth:per_step=0.1"], 0)
    assert skewed.skew == Skew(frac=0.9, expert=1)
    assert skewed.skew_growth == SkewGrowth(per_step=0.1)
    assert not FaultPlan.from_specs(["no-set-epoch"], 0).set_epoch
    healthy = FaultPlan.from_specs([], 0)
    assert healthy.compute_delay_s() == healthy.comm_delay_s("world") == 0
    assert healthy.leak_bytes_per_step() == 0 and healthy.set_epoch
    with pytest.raises(ValueError, match="at most one Skew"):
        FaultPlan.from_specs(["skew:frac=0.5", "skew:frac=0.6"], 0)


def test_apply_compute_delay_sleeps_only_on_straggler(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("reference_runs.faults.time.sleep", slept.append)
    FaultPlan.from_specs(["straggler:rank=1,ms=30"], rank=0).apply_compute_delay()
    assert slept == []
    FaultPlan.from_specs(["straggler:rank=1,ms=30"], rank=1).apply_compute_delay()
    assert slept == [pytest.approx(0.03)]


def test_slowdown_grows_with_the_step_on_its_ranks() -> None:
    everyone = FaultPlan.from_specs(["slowdown:ms=5"], rank=3)
    assert [everyone.compute_delay_s(step) for step in (0, 1, 4)] == pytest.approx([0, 0.005, 0.02])
    specs = ["slowdown:ms=5,rank=1", "straggler:rank=1,ms=10"]
    assert FaultPlan.from_specs(specs, rank=1).compute_delay_s(2) == pytest.approx(0.02)
    assert FaultPlan.from_specs(specs, rank=0).compute_delay_s(2) == 0


def test_stage_slow_delays_every_micro_batch_of_its_stage() -> None:
    specs = ["stage-slow:stage=1,ms=5", "straggler:rank=3,ms=10"]
    on_stage = FaultPlan.from_specs(specs, rank=2, stage=1)
    assert on_stage.compute_delay_s(0) == on_stage.compute_delay_s(7) == pytest.approx(0.005)
    assert FaultPlan.from_specs(specs, rank=3, stage=1).compute_delay_s() == pytest.approx(0.015)
    assert FaultPlan.from_specs(specs, rank=0, stage=0).compute_delay_s() == 0
    # without a pipeline every rank is stage 0
    assert FaultPlan.from_specs(["stage-slow:stage=0,ms=2"], 5).compute_delay_s() == 0.002


def test_jitter_is_once_per_step_within_bounds_and_seeded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = [FaultPlan.from_specs(["jitter:ms=40"], rank=r, seed=3) for r in range(4)]
    draws = [[p.jitter_s(step) for step in range(6)] for p in plans]
    assert all(0 <= d <= 0.04 for row in draws for d in row)
    assert len({d for row in draws for d in row}) == 24  # every rank and step its own draw
    again = FaultPlan.from_specs(["jitter:ms=40"], rank=2, seed=3)
    assert [again.jitter_s(step) for step in range(6)] == draws[2]
    other = FaultPlan.from_specs(["jitter:ms=40"], rank=2, seed=4)
    assert [other.jitter_s(step) for step in range(6)] != draws[2]
    assert plans[0].compute_delay_s(1) == 0  # not per micro-batch
    slept: list[float] = []
    monkeypatch.setattr("reference_runs.faults.time.sleep", slept.append)
    for step in (0, 1):
        for _mb in range(3):
            plans[1].apply_compute_delay(step)
    assert slept == [pytest.approx(draws[1][0]), pytest.approx(draws[1][1])]


def test_loader_stall_sleeps_only_on_its_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("reference_runs.faults.time.sleep", slept.append)
    stalled = FaultPlan.from_specs(["loader-stall:rank=1,ms=40"], rank=1)
    healthy = FaultPlan.from_specs(["loader-stall:rank=1,ms=40"], rank=0)
    assert stalled.compute_delay_s() == 0 and stalled.loader_stall_s() == pytest.approx(0.04)
    healthy.apply_loader_stall()
    stalled.apply_compute_delay()
    assert slept == []
    stalled.apply_loader_stall()
    assert slept == [pytest.approx(0.04)]


def test_leak_retains_bytes_saved_for_backward() -> None:
    leak = Leak(bytes_per_step=4096)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for _ in range(3):
            leak.step()
    assert leak.retained_bytes == 3 * 4096
    assert saved == [4096, 4096, 4096]
    assert sum(t.grad_fn is not None for t in leak._kept) == 3
    assert Leak(0).retained_bytes == 0


# ---------------------------------------------------------------- config


def test_config_defaults() -> None:
    config = parse_config([], trainer="dp")
    assert config == TrainConfig(trainer="dp")
    assert config.out is None and config.steps == 10 and config.inject == []
    assert config.gpt_config() == GPTConfig()


def test_config_every_option() -> None:
    argv = shlex.split(
        "--layers 3 --hidden 64 --heads 8 --seq 32 --micro-batch 2 --vocab 100 --dp 2 --tp 2 "
        "--pp 2 --ep 1 --microbatches 8 --schedule interleaved --virtual-stages 2 --experts 8 "
        "--topk 1 --capacity-factor 1.5 --aux-loss-coef 0 --bucket-mb 4 --grad-accum 2 "
        "--sequence-parallel --gpus-per-node 4 --device-memory-gb 80 --profile-steps 2:5 "
        "--seed 7 --inject straggler:rank=1,ms=10 --inject no-set-epoch --steps 20 --out r1 "
        "--lr 1e-3 --no-collectors"
    )
    config = parse_config(argv, trainer="pp")
    assert config == TrainConfig(
        trainer="pp", out="r1", steps=20, layers=3, hidden=64, heads=8, seq=32, micro_batch=2,
        vocab=100, dp=2, tp=2, pp=2, ep=1, microbatches=8, schedule="interleaved",
        virtual_stages=2, experts=8, topk=1, capacity_factor=1.5, aux_loss_coef=0.0,
        bucket_mb=4.0, grad_accum=2, sequence_parallel=True, gpus_per_node=4,
        device_memory_gb=80.0, profile_steps=(2, 5), seed=7,
        inject=["straggler:rank=1,ms=10", "no-set-epoch"], lr=1e-3, no_collectors=True,
    )  # fmt: skip
    assert config.gpt_config() == GPTConfig(layers=3, hidden=64, heads=8, seq_len=32, vocab=100)
    topo = config.topology(8)
    assert (topo.dp, topo.tp, topo.pp, topo.ep, topo.gpus_per_node) == (2, 2, 2, 1, 4)


def test_config_topology_default_axis() -> None:
    topo = parse_config(["--dp", "2"], trainer="tp").topology(8, default_axis="tp")
    assert (topo.dp, topo.tp) == (2, 4)


@pytest.mark.parametrize(
    "argv",
    [
        ["--inject", "straggler:rank=1"],
        ["--inject", "bogus"],
        ["--profile-steps", "5:2"],
        ["--profile-steps", "5"],
        ["--profile-steps", "a:b"],
        ["--schedule", "zigzag"],
        ["--steps", "0"],
        ["--layers", "two"],
        ["--capacity-factor", "-1"],
        ["--aux-loss-coef", "-0.1"],
        ["--hidden", "30", "--heads", "4"],
        ["--topk", "5", "--experts", "4"],
        ["--unknown-option"],
    ],
)
def test_config_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(argv, trainer="dp")
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_config_bad_injection_message_quotes_spec(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--inject", "leak:mb=-5"], trainer="zero3")
    err = capsys.readouterr().err
    assert "'leak:mb=-5'" in err and "must be a finite number >= 0" in err
