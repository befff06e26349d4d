"""ZeRO-3 reference trainer: PyTorch FSDP2 (`fully_shard`) per transformer block and at the root.

    diag run zero3 --nproc 4 --steps 10
    diag run zero3 --nproc 2 --clip-grad 1.0 --device-memory-gb 0.002
    torchrun --nproc-per-node 4 -m reference_runs.zero3 --steps 10 --out runs/zero3

Follows Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (SC 2020, arXiv 1910.02054), stage 3, as PyTorch FSDP2 implements it (per-parameter
DTensor shards on dim 0; Zhao et al., "PyTorch FSDP", arXiv 2304.11277): every rank keeps 1/N of
each parameter, gradient and Adam state. A block's parameters are all-gathered before its
forward and freed after it, gathered again in backward, and their gradients reduce-scattered
(averaged), so each rank ends the step with its shard of the DDP gradient: memory bought with
communication. The root unit (embeddings, final LayerNorm, the tied LM head) stays gathered from
forward to backward, FSDP2's default for the root. ZeRO never shards activations.

`--grad-accum k` runs k micro-batches per step, the first k-1 without reduce-scatter
(`set_requires_gradient_sync(False)`, FSDP2's `no_sync`). `--clip-grad X` clips the global norm
and records the local (shard) and global norms. collectors/fsdp.py records each unit's
all-gathers (`fsdp.ag.fwd`, `fsdp.ag.bwd`) and reduce-scatters (`fsdp.rs`) against its unsharded
bytes, and the unsharded parameters as communication buffers.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from collectors.fsdp import register_fsdp_recording
from reference_runs.common import (
    build_groups,
    clip_gradients,
    exit_process,
    init_distributed,
    open_recorder,
    shutdown,
)
from reference_runs.config import TrainConfig, parse_config
from reference_runs.data import SyntheticTokens, iterate_batches, make_loader
from reference_runs.faults import FaultPlan, Leak
from reference_runs.model import GPT, count_params
from reference_runs.topology import Topology


def shard_model(model: GPT, mesh: DeviceMesh) -> list[tuple[Any, int | None]]:
    """`fully_shard` each block, then the root (what is left: embeddings, ln_f, tied head).

    Returns the FSDP units with their layer (None for the root), in forward order of blocks.
    """
    units: list[tuple[Any, int | None]] = []
    for layer, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh)
        units.append((block, layer))
    fully_shard(model, mesh=mesh)
    units.append((model, None))
    return units


def plan(cfg: TrainConfig, world_size: int, argv: Sequence[str] = ()) -> Topology:
    """The validated layout; ValueError naming the values when this trainer cannot run it."""
    topology = cfg.topology(world_size, default_axis="dp")
    if topology.dp != world_size:
        raise ValueError(f"the zero3 trainer shards over all ranks: --dp must be {world_size}")
    return topology


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv, "zero3")
    env = init_distributed()
    topology = plan(cfg, env.world_size)
    groups = build_groups(topology, env.rank)
    faults = FaultPlan.from_specs(cfg.inject, env.rank)

    torch.manual_seed(cfg.seed)  # every rank builds the same full model, then keeps its shards
    model = GPT(cfg.gpt_config()).to(env.device)
    params = count_params(model)
    mesh = init_device_mesh(env.device.type, (topology.dp,), mesh_dim_names=("dp",))
    units = shard_model(model, mesh)
    sharded = list(model.parameters())  # DTensors holding this rank's shards
    optimizer = torch.optim.AdamW(sharded, lr=cfg.lr)
    layout = {
        "zero_stage": 3,
        "grad_accum": cfg.grad_accum,
        "microbatches": cfg.grad_accum,
        "bucket_mb": None,
    }
    rec = open_recorder(cfg, env, topology, groups, model, optimizer, params, layout)
    rec.register_group("dp", mesh.get_group("dp"))
    comm_delay_s = faults.comm_delay_s("dp")
    if rec.enabled or comm_delay_s:
        register_fsdp_recording(rec, units, delay_s=comm_delay_s)

    samples_per_epoch = cfg.micro_batch * cfg.grad_accum * topology.dp * 4  # 4 steps an epoch
    dataset = SyntheticTokens(samples_per_epoch, cfg.seq, cfg.vocab, seed=cfg.seed)
    loader, sampler = make_loader(dataset, cfg.micro_batch, env.rank, topology.dp, cfg.seed)
    on_epoch = rec.event if rec.enabled else None
    batches = iterate_batches(loader, sampler, set_epoch=faults.set_epoch, on_epoch=on_epoch)
    leak = Leak(faults.leak_bytes_per_step(), env.device) if faults.leak_bytes_per_step() else None
    tokens_per_step = cfg.micro_batch * cfg.seq * cfg.grad_accum

    failed = True
    try:
        for step_index in range(cfg.steps):
            with rec.step(tokens=tokens_per_step) as step:
                for mb in range(cfg.grad_accum):
                    with rec.span("data", mb=mb):
                        inputs, targets = (t.to(env.device) for t in next(batches))
                    if cfg.grad_accum > 1:  # reduce-scatter in the last micro-batch only
                        model.set_requires_gradient_sync(mb == cfg.grad_accum - 1)
                    with rec.span("fwd", mb=mb):
                        faults.apply_compute_delay(step_index)
                        _, loss = model(inputs, targets)
                        if leak is not None:
                            leak.step()
                    with rec.span("bwd", mb=mb):
                        (loss / cfg.grad_accum).backward()
                with rec.span("opt"):
                    if cfg.clip_grad is not None:
                        clip_gradients(rec, sharded, cfg.clip_grad)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                step.loss = loss.item()
        failed = False
    finally:
        shutdown(rec, failed=failed)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_process(0)  # skip native teardown: see its docstring
