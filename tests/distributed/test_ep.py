"""The EP reference trainer: all-to-all bytes against the ledger, drop rates at
two capacity factors, the skew injections; and, in a 2-process gloo world, EP gradients against
the single-process MoE model's on the same tokens."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from collectors import NullRecorder
from diag.contract import ledger
from diag.metrics import compute_metrics
from diag.outputs.report import build_report
from diag.read.load import load_run
from reference_runs.ep import sync_gradients
from reference_runs.ep_comms import EpComm
from reference_runs.faults import FaultPlan
from reference_runs.model import GPT, GPTConfig
from reference_runs.moe import to_moe
from reference_runs.topology import Topology
from tests.distributed.conftest import diag_run

pytestmark = pytest.mark.dist

LAYERS, HIDDEN, HEADS, SEQ, MICRO_BATCH, EXPERTS, TOPK = 2, 64, 4, 32, 4, 4, 2
ARGS = [
    "--layers", str(LAYERS), "--hidden", str(HIDDEN), "--heads", str(HEADS), "--seq", str(SEQ),
    "--micro-batch", str(MICRO_BATCH), "--experts", str(EXPERTS), "--steps", "3",
]  # fmt: skip
TOKENS = MICRO_BATCH * SEQ  # per rank and micro-batch
A2A_TAGS = ("dispatch", "combine", "dispatch.bwd", "combine.bwd")
AUX_COEF, CAPACITY_FACTOR = 0.01, 1.0  # of the gradient check
DROPS_AT_DEFAULT_CAPACITY = 0.03
"""Drop rate a balanced (freshly initialised) router may reach at capacity factor 1.25."""


RUNS = {  # name: (ranks, trainer options)
    "no-drops": (2, [*ARGS, "--capacity-factor", "4"]),  # capacity 2T >= T: nothing dropped
    "half": (2, [*ARGS, "--capacity-factor", "0.5"]),
    "default": (2, ARGS),  # capacity factor 1.25
    "skew": (2, [*ARGS, "--topk", "1", "--inject", "skew:frac=0.7,expert=1"]),
    # first-choice share of expert 0: 0.25, 0.55, 0.85
    "skew-growth": (4, [*ARGS, "--ep", "2", "--dp", "2", "--inject", "skew-growth:per_step=0.3"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The module's runs, three at a time: what the tests read (routing, drops, bytes, groups)
    does not depend on timing, and side by side the runs overlap their start-up."""
    root = tmp_path_factory.mktemp("ep")
    with ThreadPoolExecutor(3) as pool:
        jobs = [pool.submit(diag_run, root / name, *args, nproc=nproc, trainer="ep")
                for name, (nproc, args) in RUNS.items()]  # fmt: skip
        for job in jobs:
            job.result()
    return {name: root / name for name in RUNS}


def expected_bytes(topk: int = TOPK) -> float:
    return ledger.ep_alltoall_bytes(TOKENS, topk, HIDDEN, 4)


def shares(run_dir: Path, expert: int) -> pd.Series:
    """Per (step, layer), the expert's share of the routed tokens (summed over EP groups)."""
    records = load_run(run_dir).experts
    load = records.assign(
        hot=[t[expert] for t in records["tokens"]], all=records["tokens"].map(sum)
    )
    totals = load.groupby(["step", "layer"])[["hot", "all"]].sum()
    return totals["hot"] / totals["all"]


def test_alltoall_bytes_equal_the_ledger_when_nothing_is_dropped(runs: dict[str, Path]) -> None:
    run = load_run(runs["no-drops"])
    model = run.manifest.model
    assert (model.experts, model.topk, model.capacity_factor) == (EXPERTS, TOPK, 4.0)
    assert run.manifest.layout.ep == 2 and run.manifest.groups["ep"] == [[0, 1]]

    comms = run.comms
    a2a = comms[comms["tag"].isin(A2A_TAGS)]
    assert (a2a["op"] == "all_to_all").all() and (a2a["group"] == "ep").all()
    assert (a2a["expected_bytes"] == expected_bytes()).all()
    assert (a2a.groupby(["rank", "step", "tag"]).size() == LAYERS).all()
    assert len(a2a) == 2 * 3 * len(A2A_TAGS) * LAYERS
    # every rank sends all its T x topk rows; what a rank receives sums to the same over ranks
    sent = a2a[a2a["tag"].isin(["dispatch", "combine.bwd"])]
    assert (sent["bytes"] == expected_bytes()).all()
    back = a2a[a2a["tag"].isin(["combine", "dispatch.bwd"])].groupby(["step", "tag"])["bytes"]
    assert (back.sum() == 2 * LAYERS * expected_bytes()).all()
    splits = comms[comms["tag"] == "splits"]
    assert (splits["bytes"] == 8 * EXPERTS).all() and len(splits) == 2 * 3 * LAYERS

    # dense gradients are all-reduced over ep, once a step; experts' stay local
    gpt = GPT(GPTConfig(layers=LAYERS, hidden=HIDDEN, heads=HEADS, seq_len=SEQ))
    layers = to_moe(gpt, EXPERTS, TOPK, 4.0)
    expert_ids = {id(p) for layer in layers for p in layer.experts.parameters()}
    dense = sum(p.numel() for p in gpt.parameters() if id(p) not in expert_ids)
    grads = comms[comms["tag"] == "grad"]
    assert (grads["group"] == "ep").all() and (grads["bytes"] == 4 * dense).all()
    assert len(grads) == 2 * 3

    # one experts record per step and layer, from the EP group's first rank, counts global
    experts = run.experts
    assert set(experts["rank"]) == {0} and len(experts) == 3 * LAYERS
    assert (experts["tokens"].map(sum) == 2 * TOKENS * TOPK).all()
    assert (experts["dropped"] == 0).all() and (experts["capacity"] == 2 * TOKENS).all()
    assert experts["aux_loss"].between(1.0, 1.2).all()  # 1 = perfectly balanced

    report = build_report(run, compute_metrics(run))
    rows = {c["tag"]: c for c in report["collectives"]}
    for tag in A2A_TAGS:
        assert rows[tag]["ratio"] == 1.0, tag
    for layer in report["experts"]:
        assert layer["drop_rate"] == 0 and layer["dead_experts"] == 0
        assert layer["max_over_mean"] < 1.5


def test_capacity_factor_half_drops_at_least_half_and_default_about_none(
    runs: dict[str, Path],
) -> None:
    rates = {}
    for name in ("half", "default"):
        run = load_run(runs[name])
        report = build_report(run, compute_metrics(run))
        rates[name] = [layer["drop_rate"] for layer in report["experts"]]
        dispatch = next(c for c in report["collectives"] if c["tag"] == "dispatch")
        # a dropped assignment is never sent: the dispatch falls short of the ledger by as much
        dropped = run.experts["dropped"].sum() / run.experts["tokens"].map(sum).sum()
        assert run.comms[run.comms["tag"] == "dispatch"]["bytes"].sum() == pytest.approx(
            (1 - dropped) * expected_bytes() * 2 * 3 * LAYERS
        )
        assert dispatch["ratio"] <= 1.0
    # E x capacity slots hold half of the T x topk assignments: at least half are dropped
    assert all(rate >= 0.5 for rate in rates["half"]), rates
    assert all(rate < DROPS_AT_DEFAULT_CAPACITY for rate in rates["default"]), rates


def test_skew_makes_one_expert_dominate(runs: dict[str, Path]) -> None:
    run = load_run(runs["skew"])
    assert shares(runs["skew"], expert=1).between(0.65, 0.75).all()  # top-1 share ~0.7
    report = build_report(run, compute_metrics(run))
    for layer in report["experts"]:
        assert layer["max_over_mean"] > 2.5 and layer["drop_rate"] > 0.2  # 0.7 x 4 = 2.8
    # expert 1 lives on rank 0, which sends back (combine) more than it dispatched
    combine = run.comms[run.comms["tag"] == "combine"].groupby("rank")["bytes"].sum()
    assert combine[0] > 1.5 * combine[1]


def test_skew_growth_raises_load_drops_and_imbalance_over_steps(runs: dict[str, Path]) -> None:
    run = load_run(runs["skew-growth"])
    assert run.manifest.groups["ep"] == [[0, 1], [2, 3]]
    assert set(run.experts["rank"]) == {0, 2}  # each EP group's first rank
    # with top-2 expert 0's share of all assignments is (first-choice share + second) / 2
    by_step = shares(runs["skew-growth"], expert=0).groupby(level="step").mean()
    assert by_step.is_monotonic_increasing and by_step.iloc[-1] - by_step.iloc[0] > 0.1
    load = run.experts.groupby(["step", "layer"])["tokens"].agg(lambda t: np.sum(list(t), 0))
    max_over_mean = load.map(lambda t: t.max() / t.mean()).groupby(level="step").mean()
    assert max_over_mean.is_monotonic_increasing
    dropped = run.experts.groupby("step")["dropped"].sum()
    assert dropped.is_monotonic_increasing and dropped.iloc[-1] > dropped.iloc[0]
    # diag analyze shows the drift: first against last analysed step (step 0 is warm-up)
    for layer in build_report(run, compute_metrics(run))["experts"]:
        assert layer["max_over_mean_last"] > layer["max_over_mean_first"]
        assert layer["drop_rate_last"] > layer["drop_rate_first"]
    grads = run.comms[run.comms["tag"] == "grad"]
    assert set(grads["group"]) == {"world", "dp"}  # dense over all ranks, experts over dp


def _moe_loss(model: GPT, layers: list, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's objective on one group of tokens: cross-entropy + coef x aux losses."""
    _, loss = model(idx[:, :-1], idx[:, 1:])
    return loss, loss + AUX_COEF * torch.stack([layer.aux_loss for layer in layers]).sum()


def _check_gradients(rank: int, world: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        config = GPTConfig(layers=2, hidden=32, heads=4, seq_len=8, vocab=64)
        idx = torch.randint(64, (2 * world, 9), generator=torch.Generator().manual_seed(1))
        torch.manual_seed(0)
        model = GPT(config)
        comm = EpComm(dist.group.WORLD, world, rank, NullRecorder(), expected_bytes=0)
        layers = to_moe(model, 4, 2, CAPACITY_FACTOR, comm=comm)
        loss, objective = _moe_loss(model, layers, idx[2 * rank : 2 * rank + 2])
        objective.backward()
        expert_ids = {id(p) for layer in layers for p in layer.experts.parameters()}
        params = list(model.parameters())
        sync_gradients(
            [p for p in params if id(p) not in expert_ids],
            [p for p in params if id(p) in expert_ids],
            Topology(world, ep=world), {"ep": dist.group.WORLD}, NullRecorder(),
            FaultPlan.from_specs([], rank),
        )  # fmt: skip
        dropped = torch.stack([layer.stats.dropped for layer in layers]).sum()
        dist.all_reduce(dropped)
        assert dropped > 0  # capacity binds somewhere: the drops are part of what is checked

        # one process, all experts; each rank's tokens are a group of their own (capacity and
        # aux loss are per group), and the objective is the mean over the groups
        torch.manual_seed(0)
        reference = GPT(config)
        reference_layers = to_moe(reference, 4, 2, CAPACITY_FACTOR)
        for r in range(world):
            expected, objective = _moe_loss(reference, reference_layers, idx[2 * r : 2 * r + 2])
            (objective / world).backward()
            if r == rank:
                torch.testing.assert_close(loss, expected)
        grads = dict(reference.named_parameters())
        for name, param in model.named_parameters():
            prefix, is_expert, rest = name.partition(".experts.")
            if is_expert:  # local expert i is global expert rank x 4/world + i
                local, tail = rest.split(".", 1)
                name = f"{prefix}.experts.{rank * 4 // world + int(local)}.{tail}"
            want = grads[name].grad
            torch.testing.assert_close(param.grad, want, rtol=1e-4, atol=1e-6, msg=name)
    finally:
        dist.destroy_process_group()


def test_ep_gradients_are_the_single_process_models(tmp_path: Path) -> None:
    """Dispatch, combine (forward and backward), the drops and the gradient sync give every
    rank the gradients of the one-process MoE model on all ranks' tokens, aux loss included."""
    # fork: the children need not import torch and this module again
    mp.start_processes(
        _check_gradients, args=(2, str(tmp_path / "store")), nprocs=2, start_method="fork"
    )
