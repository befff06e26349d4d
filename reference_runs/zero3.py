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

import contextlib
import sys
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from collectors.fsdp import register_fsdp_recording
from diag.contract.names import DP
from reference_runs.common import Loop, Setup, accumulated_step, exit_process, run_trainer
from reference_runs.config import TrainConfig
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


def plan(cfg: TrainConfig, world_size: int) -> Topology:
    """The validated layout; ValueError naming the values when this trainer cannot run it."""
    topology = cfg.topology(world_size, default_axis="dp")
    if topology.dp != world_size:
        raise ValueError(f"the zero3 trainer shards over all ranks: --dp must be {world_size}")
    return topology


def build(setup: Setup) -> Loop:
    """The sharded model (every rank builds the same full model, then keeps its shards), its
    recorder and data, and one optimizer step of `--grad-accum` micro-batches."""
    cfg, env, faults = setup.cfg, setup.env, setup.faults
    dp = setup.topology.dp
    model = GPT(cfg.gpt_config()).to(env.device)
    params = count_params(model)
    mesh = init_device_mesh(env.device.type, (dp,), mesh_dim_names=(DP,))
    units = shard_model(model, mesh)
    sharded = list(model.parameters())  # DTensors holding this rank's shards
    optimizer = torch.optim.AdamW(sharded, lr=cfg.lr)
    layout = {
        "zero_stage": 3,
        "grad_accum": cfg.grad_accum,
        "microbatches": cfg.grad_accum,
        "bucket_mb": None,
    }
    rec = setup.open_recorder(model, optimizer, params, layout)
    rec.register_group(DP, mesh.get_group(DP))
    comm_delay_s = faults.comm_delay_s(DP)
    if rec.enabled or comm_delay_s:
        register_fsdp_recording(rec, units, delay_s=comm_delay_s)
    batches = setup.batches(rec, env.rank, dp, cfg.grad_accum)

    def gradient_sync(last: bool) -> contextlib.AbstractContextManager[object]:
        if cfg.grad_accum > 1:  # reduce-scatter in the last micro-batch only
            model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    train_step = accumulated_step(setup, rec, batches, model, gradient_sync, optimizer, sharded)
    return Loop(rec, train_step)


def main(argv: list[str] | None = None) -> None:
    run_trainer("zero3", plan, build, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_process(0)  # skip native teardown: see its docstring
