"""The TP trainer's pieces in one process: shards recombine to the full layers, and in a 1-rank
gloo world `f`, `g` and the sequence-parallel collectives are identities, recorded as such."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from diag.metrics import compute_metrics
from diag.read.load import load_run
from reference_runs.model import GPT, GPTConfig
from reference_runs.tp import (
    ColumnParallelLinear,
    ParallelAttention,
    ParallelMLP,
    RowParallelLinear,
    TensorParallelGPT,
    shard,
)
from reference_runs.tp_comms import (
    CopyToParallelRegion,
    GatherFromSequenceParallel,
    ReduceFromParallelRegion,
    ReduceScatterToSequenceParallel,
    TpComm,
)

CONFIG = GPTConfig(layers=2, hidden=32, heads=4, seq_len=8, vocab=64)


def test_shard_splits_evenly_or_refuses() -> None:
    assert shard(8, 4, 1).tolist() == [2, 3]
    assert torch.cat([shard(12, 3, r) for r in range(3)]).tolist() == list(range(12))
    with pytest.raises(ValueError, match="not divisible by tp=3"):
        shard(8, 3, 0)


@pytest.mark.parametrize("tp", [2, 4])
def test_column_then_row_parallel_linears_recombine(tp: int) -> None:
    torch.manual_seed(0)
    first, second = nn.Linear(16, 32), nn.Linear(32, 16)
    x = torch.randn(3, 5, 16)
    columns = [ColumnParallelLinear(first, shard(32, tp, r))(x) for r in range(tp)]
    torch.testing.assert_close(torch.cat(columns, dim=-1), first(x))

    hidden = first(x)
    rows = [RowParallelLinear(second, shard(32, tp, r)) for r in range(tp)]
    partial = sum(row(hidden[..., shard(32, tp, r)]) for r, row in enumerate(rows))
    torch.testing.assert_close(rows[0].add_bias(partial), second(hidden))


@pytest.mark.parametrize("tp", [2, 4])
def test_attention_and_mlp_shards_sum_to_the_full_block(tp: int) -> None:
    """Without a group `g` is skipped: each shard returns its partial sum plus the bias."""
    torch.manual_seed(0)
    block = GPT(CONFIG).blocks[0]
    x = torch.randn(2, CONFIG.seq_len, CONFIG.hidden)
    for full, parallel in ((block.attn, ParallelAttention), (block.mlp, ParallelMLP)):
        shards = [parallel(full, tp, r) for r in range(tp)]  # type: ignore[operator]
        bias = shards[0].proj.bias
        total = sum(s(x) - bias for s in shards) + bias
        torch.testing.assert_close(total, full(x), rtol=1e-5, atol=1e-6)
        assert shards[0].proj.weight.shape[1] == full.proj.weight.shape[1] // tp


class FakeRecorder:
    """Keeps the arguments of every `collective(...)` call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def collective(self, op: str, nbytes: int, group: Any = None, **fields: Any) -> Any:
        self.calls.append({"op": op, "bytes": nbytes, **fields})
        return contextlib.nullcontext()


@pytest.fixture
def one_rank_comm(tmp_path: Path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield TpComm(group=None, size=1, rank=0, rec=FakeRecorder(), expected_bytes=2 * 8 * 32 * 4)
    finally:
        dist.destroy_process_group()


def test_f_and_g_are_identities_with_the_right_gradients(one_rank_comm: TpComm) -> None:
    x = torch.randn(2, 8, 32, requires_grad=True)
    weights = torch.randn(2, 8, 32)
    for fn in (CopyToParallelRegion, ReduceFromParallelRegion):
        y = fn.apply(x, one_rank_comm, ("mlp", 1))
        torch.testing.assert_close(y, x)
        (grad,) = torch.autograd.grad((y * weights).sum(), x)
        torch.testing.assert_close(grad, weights)
    calls = one_rank_comm.rec.calls
    # f reduces in backward, g in forward: one all-reduce each, tagged with its place
    assert [c["tag"] for c in calls] == ["tp.mlp.bwd", "tp.mlp.fwd"]
    assert all(c["op"] == "all_reduce" and c["layer"] == 1 for c in calls)
    assert all(c["bytes"] == c["expected_bytes"] == 2 * 8 * 32 * 4 for c in calls)


def test_sequence_parallel_pair_is_an_identity_in_one_rank(one_rank_comm: TpComm) -> None:
    x = torch.randn(2, 8, 32, requires_grad=True)
    weights = torch.randn(2, 8, 32)
    gathered = GatherFromSequenceParallel.apply(x, one_rank_comm, ("attn", 0))
    y = ReduceScatterToSequenceParallel.apply(gathered, one_rank_comm, ("attn", 0))
    torch.testing.assert_close(y, x)
    (grad,) = torch.autograd.grad((y * weights).sum(), x)
    torch.testing.assert_close(grad, weights)
    ops = [(c["op"], c["tag"]) for c in one_rank_comm.rec.calls]
    assert ops == [
        ("all_gather", "tp.attn.fwd"),
        ("reduce_scatter", "tp.attn.fwd"),
        ("all_gather", "tp.attn.bwd"),
        ("reduce_scatter", "tp.attn.bwd"),
    ]


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_one_rank_tensor_parallel_gpt_is_the_gpt(
    one_rank_comm: TpComm, sequence_parallel: bool
) -> None:
    torch.manual_seed(0)
    full = GPT(CONFIG)
    reference = copy.deepcopy(full)
    model = TensorParallelGPT(full, one_rank_comm, sequence_parallel)
    idx = torch.randint(CONFIG.vocab, (2, CONFIG.seq_len))
    _, loss = model(idx, idx)
    _, expected = reference(idx, idx)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(model.gpt.tok_emb.weight.grad, reference.tok_emb.weight.grad)
    block, ref_block = model.gpt.blocks[1], reference.blocks[1]
    torch.testing.assert_close(block.mlp.fc.weight.grad, ref_block.mlp.fc.weight.grad)
    expected_calls = 4 * CONFIG.layers * (2 if sequence_parallel else 1)
    layer_calls = [c for c in one_rank_comm.rec.calls if c["layer"] is not None]
    assert len(layer_calls) == expected_calls


def test_analysis_counts_tp_collectives_against_the_ledger(runs) -> None:
    """1 layer, 2 micro-batches: the ledger wants 4 all-reduces a step each way; rank 1 misses
    one forward all-reduce in step 1 (steps 1-2 analysed: 3.75 of 4 a step on average)."""
    payload = 2 * 8 * 32 * 4
    records: dict[int, list[dict[str, Any] | str]] = {}
    for rank in (0, 1):
        rows: list[dict[str, Any] | str] = []
        for step in range(3):
            t0 = 100 * step
            for i, (name, way) in enumerate(
                (n, w) for _ in range(2) for n in ("attn", "mlp") for w in ("fwd", "bwd")
            ):
                if (rank, step, i) == (1, 1, 0):
                    continue
                rows.append(runs.comm(step, t0 + i, t0 + i + 0.5, group="tp", bytes=payload,
                                      tag=f"tp.{name}.{way}", layer=0))  # fmt: skip
            rows.append(runs.step(step, t0, t0 + 90))
        records[rank] = rows
    manifest = runs.manifest(
        2, layout={"dp": 1, "tp": 2, "microbatches": 2},
        model={"layers": 1, "micro_batch": 2, "seq_len": 8, "hidden": 32, "dtype": "float32"},
    )  # fmt: skip
    rows_out = compute_metrics(load_run(runs.write(records, manifest))).summary["tp_vs_ledger"]
    by_way = {r["direction"]: r for r in rows_out}
    assert [r["direction"] for r in rows_out] == ["fwd", "bwd"]
    assert by_way["bwd"]["count_per_step"] == by_way["bwd"]["ledger_count_per_step"] == 4
    assert by_way["bwd"]["ratio"] == 1.0
    assert by_way["fwd"]["count_per_step"] == 15 / 4
    assert by_way["fwd"]["bytes_per_step"] == 15 / 4 * payload
    assert by_way["fwd"]["ledger_bytes_per_step"] == 4 * payload
    assert by_way["fwd"]["ratio"] == 15 / 16
