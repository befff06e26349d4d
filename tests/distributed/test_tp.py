"""The TP reference trainer: collectives against the ledger, the loss of the
single-process model, layouts and hosts in the manifest; and TP gradients against the full
model's in a 2-process gloo world."""

from __future__ import annotations

import copy
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from collectors import NullRecorder
from diag.contract import ledger
from diag.metrics import compute_metrics
from diag.outputs.report import build_report
from diag.read.load import load_run
from reference_runs.data import SyntheticTokens, iterate_batches, make_loader
from reference_runs.model import GPT, GPTConfig, count_params
from reference_runs.tp import TensorParallelGPT, shard
from reference_runs.tp_comms import TpComm
from tests.conftest import raw_records
from tests.distributed.conftest import diag_run

pytestmark = pytest.mark.dist

LAYERS, HIDDEN, HEADS, SEQ, MICRO_BATCH, MICROBATCHES, STEPS, LR = 2, 64, 4, 16, 2, 2, 3, 1e-2
VOCAB = 512  # the trainer's default
ARGS = [
    "--layers", str(LAYERS), "--hidden", str(HIDDEN), "--heads", str(HEADS), "--seq", str(SEQ),
    "--micro-batch", str(MICRO_BATCH), "--microbatches", str(MICROBATCHES),
    "--steps", str(STEPS), "--lr", str(LR),
]  # fmt: skip
CONFIG = GPTConfig(layers=LAYERS, hidden=HIDDEN, heads=HEADS, seq_len=SEQ, vocab=VOCAB)
PAYLOAD = ledger.tp_allreduce_bytes(MICRO_BATCH, SEQ, HIDDEN, dtype_bytes=4)
DELAY_MS = 30
"""The tp2 x dp2 run's injected latency on its dp collectives."""


RUNS = {  # name: (ranks, trainer options)
    "tp4": (4, [*ARGS, "--gpus-per-node", "2"]),
    "tp2-dp2": (4, [*ARGS, "--tp", "2", "--dp", "2", "--gpus-per-node", "2",
                    "--inject", f"slow-comm:ms={DELAY_MS},group=dp"]),
    "sp": (2, [*ARGS, "--sequence-parallel"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The module's runs at once: what the tests read (bytes, counts, groups, losses, and the
    dp delay's lower bound) does not depend on timing, and side by side the runs overlap their
    start-up."""
    root = tmp_path_factory.mktemp("tp")
    with ThreadPoolExecutor(len(RUNS)) as pool:
        jobs = [pool.submit(diag_run, root / name, *args, nproc=nproc, trainer="tp")
                for name, (nproc, args) in RUNS.items()]  # fmt: skip
        for job in jobs:
            job.result()
    return {name: root / name for name in RUNS}


def single_process_losses(micro_batch: int, dp: int = 1) -> list[float]:
    """What the trainer does, in one process with the full model: mean micro-batch loss a step."""
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    dataset = SyntheticTokens(MICRO_BATCH * MICROBATCHES * dp * 4, SEQ, VOCAB, seed=0)
    batches = iterate_batches(*make_loader(dataset, micro_batch, 0, 1, seed=0), set_epoch=True)
    losses = []
    for _ in range(STEPS):
        step_losses = []
        for _ in range(MICROBATCHES):
            _, loss = model(*next(batches))
            (loss / MICROBATCHES).backward()
            step_losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(sum(step_losses) / MICROBATCHES)
    return losses


def run_losses(run_dir: Path) -> dict[int, list[float]]:
    steps = load_run(run_dir).steps.sort_values(["rank", "step"])
    return {int(r): list(g["loss"]) for r, g in steps.groupby("rank")}


def test_tp4_collectives_match_the_ledger_and_the_loss_the_single_process_model(
    runs: dict[str, Path],
) -> None:
    run = load_run(runs["tp4"])
    assert run.manifest.layout.tp == 4 and run.manifest.status == "complete"
    # the tp group spans both virtual hosts
    assert run.manifest.groups["tp"] == [[0, 1, 2, 3]]
    assert [r.host for r in run.manifest.ranks] == ["node0", "node0", "node1", "node1"]

    per_step = 2 * LAYERS * MICROBATCHES
    assert ledger.tp_allreduce_count(LAYERS, MICROBATCHES) == (per_step, per_step)
    tp = run.comms[run.comms["group"] == "tp"]
    assert (tp["op"] == "all_reduce").all() and (tp["bytes"] == PAYLOAD).all()
    assert (tp["expected_bytes"] == PAYLOAD).all() and (tp["group_size"] == 4).all()
    direction = tp["tag"].str.rsplit(".", n=1).str[1]
    counts = tp.groupby(["rank", "step", direction]).size()
    assert len(counts) == 4 * STEPS * 2 and (counts == per_step).all()
    # every layer and place, fwd and bwd, once per micro-batch (layer from the raw records)
    raw = raw_records(runs["tp4"], 2)
    places = Counter((r["layer"], r["tag"]) for r in raw if r["kind"] == "comm")
    assert places == {
        (layer, f"tp.{name}.{way}"): MICROBATCHES * STEPS
        for layer in range(LAYERS) for name in ("attn", "mlp") for way in ("fwd", "bwd")
    }  # fmt: skip

    report = build_report(run, compute_metrics(run))  # what `diag analyze --format json` prints
    rows = report["summary"]["tp_vs_ledger"]
    assert [(r["op"], r["direction"]) for r in rows] == [
        ("all_reduce", "fwd"),
        ("all_reduce", "bwd"),
    ]
    for row in rows:
        assert row["count_per_step"] == row["ledger_count_per_step"] == per_step
        assert row["bytes_per_step"] == row["ledger_bytes_per_step"] == per_step * PAYLOAD
        assert row["ratio"] == 1.0
    assert {c["ratio"] for c in report["collectives"]} == {1.0}

    reference = single_process_losses(MICRO_BATCH)
    for rank, losses in run_losses(runs["tp4"]).items():
        assert losses == pytest.approx(reference, rel=1e-4), f"rank {rank}"


def test_tp2_x_dp2_groups_hosts_gradient_bytes_and_loss(runs: dict[str, Path]) -> None:
    run = load_run(runs["tp2-dp2"])
    assert run.manifest.groups["tp"] == [[0, 1], [2, 3]]
    assert run.manifest.groups["dp"] == [[0, 2], [1, 3]]
    assert [r.host for r in run.manifest.ranks] == ["node0", "node0", "node1", "node1"]

    # DDP all-reduces the TP shard's gradients over dp once a step: the shard's bytes
    stub = TpComm(group=None, size=2, rank=0, rec=None, expected_bytes=0)
    shard_bytes = 4 * count_params(TensorParallelGPT(GPT(CONFIG), stub))
    assert shard_bytes < 4 * count_params(GPT(CONFIG))
    in_dp = run.comms[run.comms["group"] == "dp"]
    rebuilt = in_dp[in_dp["tag"] == "ddp.buckets"]  # DDP's one bucket rebuild, a broadcast
    assert set(rebuilt["step"]) == {1} and set(rebuilt["op"]) == {"broadcast"}
    grads = in_dp[in_dp["tag"] != "ddp.buckets"]
    assert (grads["tag"] == "grad").all()
    per_step = grads.groupby(["rank", "step"])["bytes"].sum()
    assert len(per_step) == 4 * STEPS and (per_step == shard_bytes).all()
    # the injected latency sits inside the dp collectives only
    assert (grads["t1"] - grads["t0"] >= DELAY_MS * 1e6).all()
    tp = run.comms[run.comms["group"] == "tp"]
    assert (tp.groupby(["rank", "step"]).size() == 4 * LAYERS * MICROBATCHES).all()

    # each dp replica sees half of the single-process micro-batch: the mean loss matches
    losses = run_losses(runs["tp2-dp2"])
    assert losses[0] == losses[1] and losses[2] == losses[3]
    mean = [(a + b) / 2 for a, b in zip(losses[0], losses[2], strict=True)]
    assert mean == pytest.approx(single_process_losses(2 * MICRO_BATCH, dp=2), rel=1e-4)


def test_sequence_parallel_pairs_reduce_scatter_with_all_gather(runs: dict[str, Path]) -> None:
    metrics = compute_metrics(load_run(runs["sp"]))
    rows = {(r["op"], r["direction"]): r for r in metrics.summary["tp_vs_ledger"]}
    assert set(rows) == {
        (op, way) for op in ("all_gather", "reduce_scatter") for way in ("fwd", "bwd")
    }
    for row in rows.values():
        assert row["count_per_step"] == row["ledger_count_per_step"] == 2 * LAYERS * MICROBATCHES
        assert row["ratio"] == 1.0
    for rank, losses in run_losses(runs["sp"]).items():
        assert losses == pytest.approx(single_process_losses(MICRO_BATCH), rel=1e-4), f"rank {rank}"


def _sharded(name: str, grad: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """The part of a full-model gradient that `rank` holds (Megatron's split, spelled out)."""
    cols = shard(HIDDEN, tp, rank)
    if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
        return grad[torch.cat([cols, cols + HIDDEN, cols + 2 * HIDDEN])]
    if name.endswith("mlp.fc.weight") or name.endswith("mlp.fc.bias"):
        return grad[shard(4 * HIDDEN, tp, rank)]
    if name.endswith("attn.proj.weight"):
        return grad[:, cols]
    if name.endswith("mlp.proj.weight"):
        return grad[:, shard(4 * HIDDEN, tp, rank)]
    return grad  # replicated


def _check_gradients(rank: int, world: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        idx = torch.randint(
            VOCAB, (MICRO_BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1)
        )
        for sequence_parallel in (False, True):
            torch.manual_seed(0)
            full = GPT(CONFIG)
            reference = copy.deepcopy(full)
            comm = TpComm(None, world, rank, NullRecorder(), expected_bytes=0)
            model = TensorParallelGPT(full, comm, sequence_parallel)
            _, loss = model(idx[:, :-1], idx[:, 1:])
            loss.backward()
            if sequence_parallel:  # what the trainer does before its optimizer step
                comm.all_reduce_grads(model.sequence_sharded_params(), "tp.sp_grads")
            _, expected = reference(idx[:, :-1], idx[:, 1:])
            expected.backward()
            torch.testing.assert_close(loss, expected)
            full_grads = {n: p.grad for n, p in reference.named_parameters()}
            for name, param in model.named_parameters():
                name = name.removeprefix("gpt.")
                want = _sharded(name, full_grads[name], world, rank)
                torch.testing.assert_close(param.grad, want, rtol=1e-4, atol=1e-6, msg=name)
    finally:
        dist.destroy_process_group()


def test_tp_gradients_are_the_full_models_shards(tmp_path: Path) -> None:
    """f/g (and the SP pair) give each rank exactly its shard of the full model's gradient; a
    uniformly mis-scaled gradient would hide from the loss test behind Adam."""
    # forked, as test_ep.py's check: the processes start without importing torch again
    mp.start_processes(
        _check_gradients, args=(2, str(tmp_path / "store")), nprocs=2, start_method="fork"
    )
