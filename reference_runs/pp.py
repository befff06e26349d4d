"""Pipeline-parallel reference trainer: GPipe, 1F1B and interleaved 1F1B, written out.

    diag run pp --nproc 4 --microbatches 8 --schedule 1f1b   # 4 stages, one block each
    torchrun --nproc-per-node 4 -m reference_runs.pp --layers 8 --microbatches 8 \
        --schedule interleaved --virtual-stages 2 --out runs/pp
    diag run pp --nproc 4 --pp 2 --dp 2 --microbatches 4      # PP=2 x DP=2

Schedules (diag/contract/schedules.py): GPipe (Huang et al. 2019, arXiv 1811.06965), 1F1B /
PipeDream-Flush (Narayanan et al. 2021, arXiv 2006.09503) and interleaved 1F1B (Narayanan et al.
2021, arXiv 2104.04473). The tiny GPT's blocks are split into p x v equal model stages; pipeline
rank s holds model stages s, s+p, ... (one per chunk). The embedding lives on model stage 0; the
final LayerNorm, the LM head and the loss on the last. The LM head is *untied* from the embedding:
it starts as a copy of the embedding matrix (so step 0 computes exactly the tied model's loss) and
then trains on its own (Megatron instead all-reduces the two copies' gradients every step).

Every forward and backward of every micro-batch is a span (`stage`, `chunk`, `mb`); the receives
that feed it are recorded outside it (pp_comms.py), so the timeline shows the bubble. With DP > 1
each stage's gradients are all-reduced over its dp group (one flat buffer) after the schedule.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from diag.contract import ledger
from diag.contract.names import DP, PP
from diag.contract.schedules import check_layout, model_stage, schedule_order, split_layers
from reference_runs.common import Loop, Setup, exit_process, run_trainer
from reference_runs.config import TrainConfig
from reference_runs.faults import FaultPlan, Leak
from reference_runs.model import GPT, count_params
from reference_runs.pp_comms import PipeComms
from reference_runs.topology import Topology


class StageChunk(nn.Module):
    """Consecutive blocks of the GPT; the first model stage embeds, the last one projects."""

    def __init__(self, gpt: GPT, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in layers)
        if last:
            self.ln_f = gpt.ln_f
            self.lm_head = nn.Linear(gpt.config.hidden, gpt.config.vocab, bias=False)
            with torch.no_grad():  # untied copy of the embedding (see the module docstring)
                self.lm_head.weight.copy_(gpt.tok_emb.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first) or hidden states -> hidden states, or logits (last)."""
        if self.first:
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def build_chunks(gpt: GPT, stage: int, stages: int, chunks: int) -> nn.ModuleList:
    """The model chunks of pipeline rank `stage` (chunk c = model stage c * stages + stage)."""
    parts = split_layers(gpt.config.layers, stages, chunks)
    out = nn.ModuleList()
    for chunk in range(chunks):
        k = model_stage(stage, chunk, stages)
        out.append(StageChunk(gpt, parts[k], first=k == 0, last=k == len(parts) - 1))
    return out


def pipeline_params(cfg: TrainConfig) -> int:
    """Parameters of the whole pipeline model: the GPT plus the untied LM head."""
    return count_params(GPT(cfg.gpt_config())) + cfg.vocab * cfg.hidden


class Pipeline:
    """Runs one step's schedule on this rank: forwards, backwards and their messages."""

    def __init__(
        self,
        cfg: TrainConfig,
        chunks: nn.ModuleList,
        stage: int,
        stages: int,
        comms: PipeComms,
        rec: Any,
        faults: FaultPlan,
        leak: Leak | None,
    ) -> None:
        self.cfg, self.chunks, self.stage, self.stages = cfg, chunks, stage, stages
        self.comms, self.rec, self.faults, self.leak = comms, rec, faults, leak
        self.order = schedule_order(
            cfg.schedule, stage, stages, cfg.microbatches, cfg.virtual_stages
        )
        self.last_k = stages * cfg.virtual_stages - 1

    def run(
        self, inputs: list[torch.Tensor], targets: list[torch.Tensor], step_index: int = 0
    ) -> float | None:
        """One step's forwards and backwards; the mean micro-batch loss on the last stage."""
        m = self.cfg.microbatches
        state: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
        losses: list[float] = []
        for action in self.order:
            k = model_stage(self.stage, action.chunk, self.stages)
            span = {"mb": action.mb, "stage": self.stage, "chunk": action.chunk}
            if action.kind == "fwd":
                x = None if k == 0 else self.comms.recv_forward(k, action.mb).requires_grad_()
                with self.rec.span("fwd", **span):
                    self.faults.apply_failure(step_index, self.rec)
                    self.faults.apply_compute_delay(step_index)
                    if self.leak is not None and action.mb == 0 and action.chunk == 0:
                        self.leak.step()
                    y = self.chunks[action.chunk](inputs[action.mb] if x is None else x)
                    if k == self.last_k:
                        loss = F.cross_entropy(y.flatten(0, 1), targets[action.mb].flatten())
                        losses.append(loss.item())
                        y = loss / m  # gradients accumulate over the m micro-batches
                if k < self.last_k:
                    self.comms.send_forward(y, k, action.mb)
                state[(action.chunk, action.mb)] = (x, y)
            else:
                x, y = state.pop((action.chunk, action.mb))
                dy = None if k == self.last_k else self.comms.recv_backward(k, action.mb)
                with self.rec.span("bwd", **span):
                    torch.autograd.backward(y, dy)
                if x is not None:
                    assert x.grad is not None
                    self.comms.send_backward(x.grad, k, action.mb)
                del x, y, dy
        self.comms.wait_sends()
        return sum(losses) / len(losses) if losses else None


def allreduce_grads(
    params: list[nn.Parameter], group: Any, dp: int, rec: Any, delay_s: float
) -> None:
    """Average the stage's gradients over its dp group: one flat all-reduce, recorded."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    nbytes = flat.numel() * flat.element_size()
    rec.set_comm_buffer("dp_flat_grads", nbytes)
    expected = int(ledger.dp_grad_payload_bytes(sum(p.numel() for p in params), 4))
    with rec.collective("all_reduce", nbytes, group, dtype="float32", expected_bytes=expected,
                        tag="grad"):  # fmt: skip
        if delay_s:
            time.sleep(delay_s)
        dist.all_reduce(flat, group=group)
    flat /= dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def plan(cfg: TrainConfig, world_size: int) -> Topology:
    """The validated topology; ValueError naming the numbers when the layout is impossible.
    Without `--layers` given (`cfg.layers_given`), a default that does not split becomes one
    block per stage."""
    topology = cfg.topology(world_size, default_axis="pp")
    if topology.tp != 1 or topology.ep != 1:
        raise ValueError(f"the pp trainer runs pp x dp only, got tp={topology.tp} ep={topology.ep}")
    if not cfg.layers_given and cfg.layers % (topology.pp * cfg.virtual_stages) != 0:
        cfg.layers = topology.pp * cfg.virtual_stages
    check_layout(cfg.schedule, cfg.layers, topology.pp, cfg.microbatches, cfg.virtual_stages)
    return topology


def build(setup: Setup) -> Loop:
    """This rank's model chunks, its recorder, messages and data, and one step's schedule
    (then the dp all-reduce and the optimizer)."""
    cfg, env, topology, groups, faults = (
        setup.cfg, setup.env, setup.topology, setup.groups, setup.faults
    )  # fmt: skip
    coords = topology.coords(env.rank)
    stage, dp_rank = coords["pp"], coords["dp"]
    chunks = build_chunks(GPT(cfg.gpt_config()), stage, topology.pp, cfg.virtual_stages)
    chunks = chunks.to(env.device)
    optimizer = torch.optim.AdamW(chunks.parameters(), lr=cfg.lr)
    layout = {"microbatches": cfg.microbatches, "schedule": cfg.schedule,
              "virtual_stages": cfg.virtual_stages}  # fmt: skip
    rec = setup.open_recorder(chunks, optimizer, pipeline_params(cfg), layout)
    boundary = int(ledger.pp_boundary_bytes(cfg.micro_batch, cfg.seq, cfg.hidden, 4))
    comms = PipeComms(
        rec, groups.get(PP), topology.group_of(env.rank, PP), stage, cfg.microbatches,
        (cfg.micro_batch, cfg.seq, cfg.hidden), boundary, faults.comm_delay_s(PP), env.device,
    )  # fmt: skip
    pipeline = Pipeline(cfg, chunks, stage, topology.pp, comms, rec, faults, setup.leak())
    has_first = any(c.first for c in chunks)
    has_last = any(c.last for c in chunks)
    # Every stage of one pipeline replica reads the same batches (same dp rank, same seed).
    m = cfg.microbatches
    batches = setup.batches(rec, dp_rank, topology.dp, m)
    params = list(chunks.parameters())

    def train_step(step_index: int) -> None:
        with rec.step(tokens=cfg.micro_batch * cfg.seq * m) as step:
            inputs: list[torch.Tensor] = []
            targets: list[torch.Tensor] = []
            if has_first or has_last:
                with rec.span("data", stage=stage):
                    for _mb in range(m):
                        x, y = next(batches)
                        inputs.append(x)
                        targets.append(y)
            step.loss = pipeline.run(inputs, targets, step_index)
            if topology.dp > 1:
                allreduce_grads(params, groups[DP], topology.dp, rec, faults.comm_delay_s(DP))
            with rec.span("opt", stage=stage):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    return Loop(rec, train_step, close=comms.close)


def main(argv: list[str] | None = None) -> None:
    run_trainer("pp", plan, build, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_process(0)  # skip native teardown: see its docstring
