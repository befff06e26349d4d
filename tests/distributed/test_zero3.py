"""The ZeRO-3 (FSDP2) reference trainer, against the DDP trainer on the same model
and data: state memory per rank, loss, all-gather/reduce-scatter bytes per unit, unsharded
buffers, local vs global gradient norm, epoch hashes and the device budget.

Two 2-rank runs, made at once and shared by the tests, with the same
model, data and global-norm clipping. The vocabulary (511 rows) does not split in two, so the
padding of uneven shards shows. The dp run also carries `--inject no-set-epoch` (it changes
only the data order from the second epoch on), the zero3 run a tiny `--device-memory-gb`
(it changes nothing but the records).
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from diag.metrics import compute_metrics
from diag.read.load import RunData, load_run
from reference_runs.model import GPT, GPTConfig, count_params
from tests.conftest import raw_records
from tests.distributed.conftest import diag_run

pytestmark = pytest.mark.dist

N, LAYERS, HIDDEN, HEADS, SEQ, VOCAB, MICRO_BATCH, STEPS = 2, 2, 64, 4, 32, 511, 2, 5
EPOCH_STEPS = 4  # the trainers' dataset holds 4 steps of samples
ARGS = [
    "--layers", str(LAYERS), "--hidden", str(HIDDEN), "--heads", str(HEADS), "--seq", str(SEQ),
    "--vocab", str(VOCAB), "--micro-batch", str(MICRO_BATCH), "--steps", str(STEPS),
    "--lr", "1e-2", "--clip-grad", "0.5",
]  # fmt: skip
STATE = ("params", "grads", "optimizer")
CONFIG = GPTConfig(LAYERS, HIDDEN, HEADS, SEQ, VOCAB)
PARAM_BYTES = 4 * count_params(GPT(CONFIG))
BLOCK_BYTES = 4 * count_params(GPT(CONFIG).blocks[0])
ROOT_BYTES = PARAM_BYTES - LAYERS * BLOCK_BYTES  # embeddings (the tied head) and ln_f
PAD_BYTES = 4 * HIDDEN  # the embedding's 511 rows are padded to 512 (dim 0, a multiple of N)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both runs at once: what the tests read (memory, bytes, losses, norms, hashes) does not
    depend on timing, and the two overlap their start-up and their waits."""
    root = tmp_path_factory.mktemp("zero3")
    paths = {name: root / name for name in ("dp", "zero3")}
    with ThreadPoolExecutor(2) as pool:
        made = [
            pool.submit(diag_run, paths["dp"], *ARGS, "--inject", "no-set-epoch", nproc=N,
                        trainer="dp"),
            pool.submit(diag_run, paths["zero3"], *ARGS, "--device-memory-gb", "0.0001",
                        nproc=N, trainer="zero3"),
        ]  # fmt: skip
        for future in made:
            future.result()
    return paths


def events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for rank in range(N):
        for record in raw_records(run_dir, rank):
            if record["kind"] == "event" and record["name"] == name:
                out.append({**record, "rank": rank})
    return out


def memory(run: RunData) -> Any:
    return run.memory.set_index(["rank", "step"]).sort_index()


def test_state_per_rank_is_a_1_over_n_share_of_ddp(runs: dict[str, Path]) -> None:
    ddp, zero3 = memory(load_run(runs["dp"])), memory(load_run(runs["zero3"]))
    assert (ddp["params"] == PARAM_BYTES).all() and (ddp["grads"] == PARAM_BYTES).all()
    ratio = zero3[list(STATE)].sum(axis=1) / (ddp[list(STATE)].sum(axis=1) / N)
    assert ratio.between(0.9, 1.1).all(), ratio
    # The gap, exactly. The parameter and gradient shards hold the padded embedding: 512 rows,
    # 256 per rank. Adam's two moments follow the unpadded shards: 256 rows on rank 0, 255 on
    # rank 1. Each parameter tensor's 4-byte Adam `step` stays whole on every rank.
    assert (zero3["params"] == (PARAM_BYTES + PAD_BYTES) / N).all()
    assert (zero3["grads"] == (PARAM_BYTES + PAD_BYTES) / N).all()
    steps_bytes = 4 * len(list(GPT(CONFIG).parameters()))
    moments = (zero3["optimizer"] - steps_bytes) - (ddp["optimizer"] - steps_bytes) / N
    assert (moments.loc[0] == PAD_BYTES).all() and (moments.loc[1] == -PAD_BYTES).all()
    # ZeRO does not shard activations; the unsharded weights saved for backward are not
    # counted again as activations (they are the all-gather buffers, in comm_buffers)
    assert (zero3["activations"].dropna() == ddp["activations"].dropna()).all()
    # the unsharded buffers peak in backward: the root (unsharded since forward), block 1 being
    # differentiated and block 0's all-gather, prefetched (FSDP2's default backward prefetch)
    assert (zero3["comm_buffers"] == ROOT_BYTES + PAD_BYTES + 2 * BLOCK_BYTES).all()


def test_loss_matches_ddp_on_the_same_data(runs: dict[str, Path]) -> None:
    """Same seed, sampler and global-norm clipping: FSDP2's averaged reduce-scatter gives each
    rank its shard of DDP's all-reduced gradient, so the losses agree to float32 reduction
    order (rel 1e-4 at lr 1e-2; measured ~1e-6) over the first epoch, where both runs see the
    same data (the dp run's `no-set-epoch` repeats epoch 0's order after it)."""
    losses = {
        name: load_run(runs[name]).steps.set_index(["rank", "step"]).sort_index()["loss"]
        for name in ("dp", "zero3")
    }
    assert len(losses["dp"]) == len(losses["zero3"]) == N * STEPS
    for rank in range(N):
        dp, zero3 = (losses[name].loc[rank].tolist() for name in ("dp", "zero3"))
        assert zero3[:EPOCH_STEPS] == pytest.approx(dp[:EPOCH_STEPS], rel=1e-4), rank
        assert zero3[STEPS - 1] < zero3[0]  # it learns


def test_all_gather_and_reduce_scatter_bytes_per_unit(runs: dict[str, Path]) -> None:
    run = load_run(runs["zero3"])
    comms = run.comms
    assert set(comms["tag"]) == {"fsdp.ag.fwd", "fsdp.ag.bwd", "fsdp.rs"}
    assert (comms["group"] == "dp").all() and (comms["group_size"] == N).all()
    assert set(comms["op"][comms["tag"] == "fsdp.rs"]) == {"reduce_scatter"}
    assert set(comms["op"][comms["tag"] != "fsdp.rs"]) == {"all_gather"}
    # Per rank and step, forward gathers the root and each block; backward gathers the blocks
    # again (the root stays unsharded from forward to backward); every unit reduce-scatters.
    # Expected: the unit's unsharded parameters; measured: the flat buffer, padding included.
    want = {
        "fsdp.ag.fwd": (LAYERS + 1, ROOT_BYTES + LAYERS * BLOCK_BYTES),
        "fsdp.ag.bwd": (LAYERS, LAYERS * BLOCK_BYTES),
        "fsdp.rs": (LAYERS + 1, ROOT_BYTES + LAYERS * BLOCK_BYTES),
    }
    for tag, (count, nbytes) in want.items():
        mine = comms[comms["tag"] == tag].groupby(["rank", "step"])
        per_step = mine[["bytes", "expected_bytes"]].agg(["size", "sum"])
        assert len(per_step) == N * STEPS
        assert (per_step[("bytes", "size")] == count).all(), tag
        assert (per_step[("expected_bytes", "sum")] == nbytes).all(), tag
        padding = PAD_BYTES if tag != "fsdp.ag.bwd" else 0  # the root unit's
        assert (per_step[("bytes", "sum")] == nbytes + padding).all(), tag
    raw = raw_records(runs["zero3"], 1)
    units = Counter((r["tag"], r["layer"]) for r in raw if r["kind"] == "comm")
    assert units == {
        (tag, layer): STEPS for tag in want for layer in (None, *range(LAYERS))
        if (tag, layer) != ("fsdp.ag.bwd", None)
    }  # fmt: skip

    table = compute_metrics(run).collectives.set_index("tag")  # what `diag analyze` reports
    assert table.loc["fsdp.ag.bwd", "ratio"] == 1.0
    pad_share = PAD_BYTES / (ROOT_BYTES + LAYERS * BLOCK_BYTES)
    for tag in ("fsdp.ag.fwd", "fsdp.rs"):
        assert table.loc[tag, "ratio"] == pytest.approx(1 + pad_share)


def test_local_gradient_norm_is_below_the_global_one(runs: dict[str, Path]) -> None:
    norms = events(runs["zero3"], "grad_norm")
    assert len(norms) == N * STEPS
    for step in range(STEPS):
        mine = [e for e in norms if e["step"] == step]
        assert all(e["local"] < e["global"] for e in mine)
        assert len({e["global"] for e in mine}) == 1  # one global norm, all-reduced
        # the shards partition the gradient: the squares of the local norms sum to the global
        assert sum(e["local"] ** 2 for e in mine) == pytest.approx(mine[0]["global"] ** 2, 1e-4)
        assert all(e["clipped"] and e["max_norm"] == 0.5 for e in mine)
    ddp = events(runs["dp"], "grad_norm")  # DDP holds the all-reduced gradient whole
    assert len(ddp) == N * STEPS
    assert all(e["local"] == pytest.approx(e["global"], rel=1e-5) for e in ddp)
    # the same global norm as ZeRO-3's in the first step (same weights, same data)
    assert ddp[0]["global"] == pytest.approx(norms[0]["global"], rel=1e-4)


def test_epoch_hashes_expose_no_set_epoch(runs: dict[str, Path]) -> None:
    hashes = {}
    for name in ("zero3", "dp"):
        epochs = events(runs[name], "epoch")
        assert sorted((e["rank"], e["step"], e["epoch"]) for e in epochs) == [
            (rank, EPOCH_STEPS * epoch, epoch) for rank in range(N) for epoch in (0, 1)
        ]
        assert all(e["samples"] == EPOCH_STEPS * MICRO_BATCH for e in epochs)
        hashes[name] = {(e["rank"], e["epoch"]): e["order_hash"] for e in epochs}
    for rank in range(N):
        assert hashes["zero3"][rank, 0] != hashes["zero3"][rank, 1]  # set_epoch: a new shuffle
        assert hashes["dp"][rank, 0] == hashes["dp"][rank, 1]  # no-set-epoch: the same order
        assert hashes["dp"][rank, 0] == hashes["zero3"][rank, 0]  # same sampler, same epoch 0
    assert hashes["zero3"][0, 0] != hashes["zero3"][1, 0]  # the ranks see different shards


def test_oom_risk_over_a_tiny_device_budget(runs: dict[str, Path]) -> None:
    run = load_run(runs["zero3"])
    assert run.manifest.hardware.device_memory_bytes == 100_000
    risks = events(runs["zero3"], "oom_risk")
    assert sorted((e["rank"], e["step"]) for e in risks) == [
        (rank, step) for rank in range(N) for step in range(STEPS)
    ]
    mem = memory(run)
    for e in risks:
        row = mem.loc[(e["rank"], e["step"])]
        assert all(e[c] == row[c] for c in (*STATE, "comm_buffers"))
        assert e["budget_bytes"] == 100_000 < e["total_bytes"]
        assert e["comm_buffers"] > 0 and e["fragmentation"] is None
    assert not events(runs["dp"], "oom_risk")  # no budget declared
