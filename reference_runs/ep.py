"""Expert-parallel reference trainer: the tiny GPT with a mixture-of-experts feed-forward layer
in every block, the experts spread over the EP group, tokens moved there and back by all-to-all.

    diag run ep --nproc 4 --steps 10 --experts 8 --topk 2 --capacity-factor 1.25   # EP=4
    diag run ep --nproc 4 --inject skew:frac=0.7,expert=0                         # a hot expert
    diag run ep --nproc 4 --ep 2 --dp 2 --inject skew-growth:per_step=0.05        # EP=2 x DP=2
    torchrun --nproc-per-node 4 -m reference_runs.ep --steps 10 --out runs/ep

Follows GShard (Lepikhin et al., arXiv 2006.16668) and Switch Transformer (Fedus et al., arXiv
2101.03961); the layer is moe.py, its communication ep_comms.py. Every rank reads its own data
shard: for the dense part (embeddings, attention, LayerNorms, routers), replicated on every rank,
the ranks are data parallel, and those gradients are averaged over all ranks in one all-reduce
after the last backward (tag `grad`). An expert's gradient already sums the contributions of
every EP rank's tokens (the combine's backward brings them to the expert's rank), so it stays
local and is only divided by the world size (after a sum over the dp group when ep < world).
The step loss is the task loss (cross-entropy); the aux loss enters the backward with weight
`--aux-loss-coef`, summed over layers.

Per step and MoE layer one `experts` record per EP group, written by the group's first rank:
`tokens` = assignments routed to each expert before capacity, summed over the EP group's ranks
and the step's micro-batches (global across the group: one all-reduce of the counts, tag
`expert_stats`), `dropped` = assignments over capacity (same sum), `capacity` = slots per expert
for one rank's micro-batch, `aux_loss` = the unweighted aux loss averaged over ranks and
micro-batches.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist

from diag.contract import ledger
from diag.contract.names import DP, EP, WORLD
from reference_runs.common import Loop, Setup, exit_process, run_trainer
from reference_runs.config import TrainConfig
from reference_runs.ep_comms import EpComm, all_reduce_
from reference_runs.faults import FaultPlan
from reference_runs.model import GPT, count_params
from reference_runs.moe import MoELayer, to_moe
from reference_runs.topology import Topology


def check_layout(cfg: TrainConfig, topology: Topology, faults: FaultPlan) -> None:
    """ValueError naming the offending values when this trainer cannot run the layout."""
    if topology.tp > 1 or topology.pp > 1:
        raise ValueError(f"the ep trainer runs ep x dp only, got tp={topology.tp} pp={topology.pp}")
    if cfg.experts % topology.ep:
        raise ValueError(f"--experts ({cfg.experts}) must be divisible by ep ({topology.ep})")
    if cfg.microbatches != 1:
        raise ValueError("the ep trainer accumulates over --grad-accum; leave --microbatches 1")
    if faults.skew is not None and faults.skew.expert >= cfg.experts:
        raise ValueError(f"skew expert {faults.skew.expert} >= --experts ({cfg.experts})")


def sync_gradients(
    dense: list[torch.nn.Parameter], experts: list[torch.nn.Parameter], topology: Topology,
    groups: dict[str, Any], rec: Any, faults: FaultPlan,
) -> None:  # fmt: skip
    """Dense gradients: mean over every rank. Expert gradients: sum over dp, / world size."""
    world = topology.world_size
    for p in [*dense, *experts]:  # every rank must all-reduce the same sizes
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    expert_grads = [p.grad for p in experts if p.grad is not None]
    replicated = [p.grad for p in dense if p.grad is not None]
    if topology.ep == 1:  # every rank holds every expert: plain data parallelism
        replicated += expert_grads
    elif topology.dp > 1:
        all_reduce_(expert_grads, groups[DP], rec, "grad", faults.comm_delay_s(DP))
    name = EP if topology.ep == world else DP if topology.dp == world else WORLD
    group = groups.get(name, dist.group.WORLD)
    all_reduce_(replicated, group, rec, "grad", faults.comm_delay_s(name))
    for grad in [*(p.grad for p in dense), *expert_grads]:
        if grad is not None:
            grad.div_(world)


def record_experts(rec: Any, layers: list[MoELayer], comm: EpComm) -> None:
    """The step's routing counts, summed over the EP group, written by its first rank."""
    rows = [
        torch.cat([s.routed.double(), s.dropped.view(1), s.aux_loss.view(1)])
        for s in (layer.stats for layer in layers)
    ]
    stats = torch.stack(rows)
    if comm.size > 1:
        all_reduce_([stats], comm.group, rec, "expert_stats", comm.delay_s)
    if comm.rank != 0:
        return
    for layer, row in zip(layers, stats.tolist(), strict=True):
        calls = max(layer.stats.calls, 1) * comm.size
        rec.experts(
            layer.layer, tokens=[int(n) for n in row[:-2]], dropped=int(row[-2]),
            capacity=layer.stats.capacity, aux_loss=row[-1] / calls,
        )  # fmt: skip


def plan(cfg: TrainConfig, world_size: int) -> Topology:
    """The validated layout; ValueError naming the values when this trainer cannot run it."""
    topology = cfg.topology(world_size, default_axis="ep")
    check_layout(cfg, topology, FaultPlan.from_specs(cfg.inject, rank=0))
    return topology


def build(setup: Setup) -> Loop:
    """The MoE model (this rank's experts), its recorder and data, and one optimizer step of
    `--grad-accum` micro-batches."""
    cfg, env, topology, groups, faults = (
        setup.cfg, setup.env, setup.topology, setup.groups, setup.faults
    )  # fmt: skip
    tokens = cfg.micro_batch * cfg.seq  # this rank's tokens per micro-batch
    comm = EpComm(
        group=groups.get(EP), size=topology.ep, rank=topology.coords(env.rank)["ep"], rec=None,
        expected_bytes=int(ledger.ep_alltoall_bytes(tokens, cfg.topk, cfg.hidden, 4)),
        delay_s=faults.comm_delay_s(EP),
    )  # fmt: skip
    model = GPT(cfg.gpt_config())
    layers = to_moe(
        model, cfg.experts, cfg.topk, cfg.capacity_factor, comm if comm.size > 1 else None, cfg.seed
    )
    model.to(env.device)
    for layer in layers:
        layer.reset_stats()
    expert_ids = {id(p) for layer in layers for p in layer.experts.parameters()}
    experts = [p for p in model.parameters() if id(p) in expert_ids]
    dense = [p for p in model.parameters() if id(p) not in expert_ids]
    params = count_params(model) + (topology.ep - 1) * sum(p.numel() for p in experts)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    layout = {"grad_accum": cfg.grad_accum, "microbatches": cfg.grad_accum}
    moe = {"experts": cfg.experts, "topk": cfg.topk, "capacity_factor": cfg.capacity_factor,
           "aux_loss_coef": cfg.aux_loss_coef}  # fmt: skip
    rec = setup.open_recorder(model, optimizer, params, layout, moe)
    comm.rec = rec
    rec.set_comm_buffer("grad_flat", 4 * sum(p.numel() for p in dense))
    batches = setup.batches(rec, env.rank, env.world_size, cfg.grad_accum)
    leak = setup.leak()

    def train_step(step_index: int) -> None:
        for layer in layers:
            layer.skew = faults.skew_at(step_index, cfg.experts)
            layer.reset_stats()
        with rec.step(tokens=tokens * cfg.grad_accum) as step:
            losses = []
            for mb in range(cfg.grad_accum):
                with rec.span("data", mb=mb):
                    inputs, targets = next(batches)
                with rec.span("fwd", mb=mb):
                    faults.apply_failure(step_index, rec)  # hang, crash, desync, kill
                    faults.apply_compute_delay(step_index)
                    _, loss = model(inputs, targets)
                    aux = torch.stack([layer.aux_loss for layer in layers]).sum()
                    if leak is not None and mb == 0:  # X MiB a step
                        leak.step()
                with rec.span("bwd", mb=mb):
                    ((loss + cfg.aux_loss_coef * aux) / cfg.grad_accum).backward()
                losses.append(loss.item())
            if env.world_size > 1:
                sync_gradients(dense, experts, topology, groups, rec, faults)
            if rec.enabled:
                record_experts(rec, layers, comm)
            with rec.span("opt"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            step.loss = sum(losses) / cfg.grad_accum

    return Loop(rec, train_step)


def main(argv: list[str] | None = None) -> None:
    run_trainer("ep", plan, build, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_process(0)  # skip native teardown: see its docstring
