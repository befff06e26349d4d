"""Tensor-parallel reference trainer: Megatron-style TP of the tiny GPT, alone or x DP.

    diag run tp --nproc 4 --steps 10 --microbatches 2                   # TP=4
    diag run tp --nproc 4 --tp 2 --dp 2 --gpus-per-node 2               # TP=2 x DP=2, 2 hosts
    diag run tp --nproc 4 --sequence-parallel                           # TP=4 + SP
    torchrun --nproc-per-node 4 -m reference_runs.tp --steps 10 --out runs/tp

Follows Shoeybi et al., "Megatron-LM" (arXiv 1909.08053), section 3: the MLP's first GEMM is
split by columns and its second by rows (`Y = GeLU(X A) B`, one all-reduce after B); attention
is split by heads (QKV column-parallel, output projection row-parallel). The conjugate `f` and
`g` of tp_comms.py make that 2 all-reduces per layer forward and 2 backward, each of
`micro_batch x seq x hidden` elements. Embeddings, LayerNorms and the tied LM head stay
replicated in the TP group. `--sequence-parallel` (Korthikanti et al., arXiv 2205.05198) turns
each all-reduce into an all-gather + reduce-scatter pair along the sequence, so the LayerNorms
and residuals hold 1/tp of it.

Every rank builds the full `model.GPT` from the same seed and keeps its shard, so the TP model
computes the same function as the single-process one. `--microbatches M` accumulates gradients
over M micro-batches per optimizer step; with dp > 1, DDP over the dp group averages each shard's
gradients across its replicas, written by the recording hook.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from diag.contract import ledger
from diag.contract.names import DP, TP
from reference_runs.common import Loop, Setup, exit_process, hook_ddp, run_trainer
from reference_runs.config import TrainConfig
from reference_runs.model import GPT, MLP, CausalSelfAttention, causal_attention, count_params
from reference_runs.topology import Topology
from reference_runs.tp_comms import (
    GatherFromSequenceParallel,
    Place,
    ScatterToSequenceParallel,
    TpComm,
    enter_parallel_region,
    leave_parallel_region,
)


def shard(n: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    """Indices of `tp_rank`'s contiguous 1/tp_size of range(n)."""
    if n % tp_size:
        raise ValueError(f"{n} is not divisible by tp={tp_size}")
    width = n // tp_size
    return torch.arange(tp_rank * width, (tp_rank + 1) * width)


class ColumnParallelLinear(nn.Module):
    """`X A_i + b_i`: the output features `rows` of a full Linear (its weight's rows)."""

    def __init__(self, full: nn.Linear, rows: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[rows].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """`X_i B_i`, a partial sum over the input features `cols`; the bias (replicated) is added
    once, after the partial sums are reduced (`add_bias`)."""

    def __init__(self, full: nn.Linear, cols: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def add_bias(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.bias is None else y + self.bias


class ParallelAttention(nn.Module):
    """Attention split by heads: this rank's heads/tp heads of Q, K and V, and the matching
    input features of the output projection."""

    def __init__(
        self, attn: CausalSelfAttention, tp_size: int, tp_rank: int,
        comm: TpComm | None = None, layer: int = 0, sequence_parallel: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        hidden = attn.heads * attn.head_dim
        heads = shard(attn.heads, tp_size, tp_rank)
        self.heads, self.head_dim, self.kind = len(heads), attn.head_dim, attn.kind
        cols = shard(hidden, tp_size, tp_rank)  # the features of this rank's heads
        self.qkv = ColumnParallelLinear(attn.qkv, torch.cat([cols + i * hidden for i in range(3)]))
        self.proj = RowParallelLinear(attn.proj, cols)
        self.comm, self.sp = comm, sequence_parallel
        self.place: Place = ("attn", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = enter_parallel_region(x, self.comm, self.place, self.sp)  # f
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).split(self.heads * self.head_dim, dim=-1)
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v, self.kind)
        y = self.proj(y.transpose(1, 2).reshape(batch, seq, -1))
        return self.proj.add_bias(leave_parallel_region(y, self.comm, self.place, self.sp))  # g


class ParallelMLP(nn.Module):
    """`GeLU(X A) B` with A split by columns and B by rows: no communication in between."""

    def __init__(
        self, mlp: MLP, tp_size: int, tp_rank: int,
        comm: TpComm | None = None, layer: int = 0, sequence_parallel: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        cols = shard(mlp.fc.out_features, tp_size, tp_rank)
        self.fc = ColumnParallelLinear(mlp.fc, cols)
        self.proj = RowParallelLinear(mlp.proj, cols)
        self.comm, self.sp = comm, sequence_parallel
        self.place: Place = ("mlp", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = enter_parallel_region(x, self.comm, self.place, self.sp)  # f
        y = self.proj(F.gelu(self.fc(x)))
        return self.proj.add_bias(leave_parallel_region(y, self.comm, self.place, self.sp))  # g


class TensorParallelGPT(nn.Module):
    """A full `GPT` whose blocks' attention and MLP are replaced by this rank's shards."""

    def __init__(self, gpt: GPT, comm: TpComm | None, sequence_parallel: bool = False) -> None:
        super().__init__()
        if gpt.config.dropout:
            raise ValueError("the tp trainer needs dropout 0 (no TP-aware RNG here)")
        if comm is None and sequence_parallel:
            raise ValueError("sequence parallelism needs a tp group")
        size, rank = (comm.size, comm.rank) if comm is not None else (1, 0)
        for layer, block in enumerate(gpt.blocks):
            args = (size, rank, comm, layer, sequence_parallel)
            block.attn = ParallelAttention(block.attn, *args)
            block.mlp = ParallelMLP(block.mlp, *args)
        self.gpt, self.comm, self.sp = gpt, comm, sequence_parallel

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.gpt
        x = g.drop(g.tok_emb(idx) + g.pos_emb(torch.arange(idx.shape[1], device=idx.device)))
        if self.sp:  # enter the sequence-parallel region: keep this rank's chunk
            x = ScatterToSequenceParallel.apply(x, self.comm, ("embed", None))
        for block in g.blocks:
            x = block(x)
        x = g.ln_f(x)
        if self.sp:  # the replicated head needs the whole sequence
            x = GatherFromSequenceParallel.apply(x, self.comm, ("head", None), False)
        logits = g.lm_head(x)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def sequence_sharded_params(self) -> list[nn.Parameter]:
        """Replicated parameters that see 1/tp of the sequence under SP: their gradients are
        partial sums, to be all-reduced over the tp group before the optimizer step."""
        params: list[nn.Parameter] = [*self.gpt.ln_f.parameters()]
        for block in self.gpt.blocks:
            params += [*block.ln_attn.parameters(), *block.ln_mlp.parameters()]
            params += [p for p in (block.attn.proj.bias, block.mlp.proj.bias) if p is not None]
        return params


def check_layout(cfg: TrainConfig, topology: Topology) -> None:
    """ValueError naming the offending values when this trainer cannot run the layout."""
    if topology.pp > 1 or topology.ep > 1:
        raise ValueError(f"the tp trainer runs tp x dp only, got pp={topology.pp} ep={topology.ep}")
    if cfg.grad_accum != 1:
        raise ValueError("the tp trainer accumulates over --microbatches; leave --grad-accum 1")
    tp = topology.tp
    if cfg.heads % tp or (4 * cfg.hidden) % tp:
        raise ValueError(f"--heads ({cfg.heads}) and 4 x --hidden must be divisible by tp ({tp})")
    if cfg.sequence_parallel and (tp == 1 or cfg.seq % tp):
        raise ValueError(f"--sequence-parallel needs tp > 1 dividing --seq, got tp={tp}")


def plan(cfg: TrainConfig, world_size: int) -> Topology:
    """The validated layout; ValueError naming the values when this trainer cannot run it."""
    topology = cfg.topology(world_size, default_axis="tp")
    check_layout(cfg, topology)
    return topology


def build(setup: Setup) -> Loop:
    """This rank's shard of the model (DDP over the dp group when dp > 1), its recorder and
    data, and one optimizer step of `--microbatches` micro-batches."""
    cfg, env, topology, groups, faults = (
        setup.cfg, setup.env, setup.topology, setup.groups, setup.faults
    )  # fmt: skip
    coords = topology.coords(env.rank)
    num_mb, sp = cfg.microbatches, cfg.sequence_parallel
    full = GPT(cfg.gpt_config()).to(env.device)
    full_params = count_params(full)
    comm = TpComm(
        group=groups.get(TP), size=topology.tp, rank=coords["tp"], rec=None,
        expected_bytes=int(ledger.tp_allreduce_bytes(cfg.micro_batch, cfg.seq, cfg.hidden, 4)),
        delay_s=faults.comm_delay_s(TP),
    )  # fmt: skip
    model = TensorParallelGPT(full, comm if topology.tp > 1 else None, sp)
    ddp = (
        DDP(model, process_group=groups[DP], bucket_cap_mb=cfg.bucket_mb)
        if topology.dp > 1
        else None
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    layout = {
        "microbatches": num_mb,
        "grad_accum": num_mb,
        "bucket_mb": cfg.bucket_mb if ddp else None,
    }
    rec = setup.open_recorder(model, optimizer, full_params, layout)
    comm.rec = rec
    if ddp is not None:
        hook_ddp(rec, ddp, faults.comm_delay_s(DP), process_group=groups[DP])
    sp_params = model.sequence_sharded_params() if sp else []
    batches = setup.batches(rec, coords["dp"], topology.dp, num_mb)
    leak = setup.leak()
    forward: Any = ddp if ddp is not None else model
    no_sync = ddp.no_sync if ddp is not None else contextlib.nullcontext

    def train_step(step_index: int) -> None:
        # tokens this rank processed; the analysis divides the sum over ranks by tp
        with rec.step(tokens=cfg.micro_batch * cfg.seq * num_mb) as step:
            losses = []
            for mb in range(num_mb):
                with rec.span("data", mb=mb):
                    inputs, targets = next(batches)
                # DDP all-reduces the gradients once, in the last micro-batch's backward
                with contextlib.nullcontext() if mb == num_mb - 1 else no_sync():
                    with rec.span("fwd", mb=mb):
                        faults.apply_failure(step_index, rec)  # hang, crash, desync, kill
                        faults.apply_compute_delay(step_index)
                        _, loss = forward(inputs, targets)
                        if leak is not None and mb == 0:  # X MiB a step
                            leak.step()
                    with rec.span("bwd", mb=mb):
                        (loss / num_mb).backward()
                losses.append(loss.item())
            if sp_params:
                comm.all_reduce_grads(sp_params, "tp.sp_grads")
            with rec.span("opt"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            step.loss = sum(losses) / num_mb  # the mean over the step's micro-batches

    return Loop(rec, train_step)


def main(argv: list[str] | None = None) -> None:
    run_trainer("tp", plan, build, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_process(0)  # skip native teardown: see its docstring
