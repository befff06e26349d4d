"""Data-parallel reference trainer: PyTorch DDP with bucketed, overlapped gradient all-reduce.

    diag run dp --nproc 4 --steps 10 --bucket-mb 25 --grad-accum 1
    torchrun --nproc-per-node 4 -m reference_runs.dp --steps 10 --out runs/dp

Follows Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training"
(VLDB 2020, arXiv 2006.15704): gradients are grouped into buckets of `--bucket-mb` MiB whose
all-reduces start during backward, so communication hides behind the rest of backward.
`--grad-accum k` runs k micro-batches per optimizer step, the first k-1 under `no_sync()`: fewer
all-reduces, each of the same size. The recording comm hook writes each bucket's all-reduce with
its payload, the ledger's expected payload and its timing.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from diag.contract.names import DP
from reference_runs.common import (
    Loop,
    Setup,
    accumulated_step,
    exit_process,
    hook_ddp,
    run_trainer,
)
from reference_runs.config import TrainConfig
from reference_runs.model import GPT, count_params
from reference_runs.topology import Topology


def plan(cfg: TrainConfig, world_size: int) -> Topology:
    """The validated layout; ValueError naming the values when this trainer cannot run it."""
    topology = cfg.topology(world_size, default_axis="dp")
    if topology.dp != world_size:
        raise ValueError(f"the dp trainer is pure data parallel: --dp must be {world_size}")
    return topology


def build(setup: Setup) -> Loop:
    """The DDP model, its recorder and data, and one optimizer step of `--grad-accum`
    micro-batches."""
    cfg, env, faults = setup.cfg, setup.env, setup.faults
    model = GPT(cfg.gpt_config()).to(env.device)
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=cfg.bucket_mb)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=cfg.lr)
    layout = {
        "grad_accum": cfg.grad_accum,
        "bucket_mb": cfg.bucket_mb,
        "microbatches": cfg.grad_accum,
    }
    rec = setup.open_recorder(model, optimizer, count_params(model), layout)
    hook_ddp(rec, ddp, faults.comm_delay_s(DP))
    batches = setup.batches(rec, env.rank, setup.topology.dp, cfg.grad_accum)

    def gradient_sync(last: bool) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext() if last else ddp.no_sync()

    train_step = accumulated_step(
        setup, rec, batches, ddp, gradient_sync, optimizer, list(model.parameters())
    )
    return Loop(rec, train_step)


def main(argv: list[str] | None = None) -> None:
    run_trainer("dp", plan, build, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_process(0)  # skip native teardown: see its docstring
