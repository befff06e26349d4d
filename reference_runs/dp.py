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
import time
from collections.abc import Sequence

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from collectors import register_recording_hook
from reference_runs.common import (
    build_groups,
    clip_gradients,
    delayed_allreduce_hook,
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


def plan(cfg: TrainConfig, world_size: int, argv: Sequence[str] = ()) -> Topology:
    """The validated layout; ValueError naming the values when this trainer cannot run it."""
    topology = cfg.topology(world_size, default_axis="dp")
    if topology.dp != world_size:
        raise ValueError(f"the dp trainer is pure data parallel: --dp must be {world_size}")
    return topology


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv, "dp")
    env = init_distributed()
    topology = plan(cfg, env.world_size)
    groups = build_groups(topology, env.rank)
    faults = FaultPlan.from_specs(cfg.inject, env.rank)

    torch.manual_seed(cfg.seed)
    model = GPT(cfg.gpt_config()).to(env.device)
    params = count_params(model)
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=cfg.bucket_mb)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=cfg.lr)
    layout = {
        "grad_accum": cfg.grad_accum,
        "bucket_mb": cfg.bucket_mb,
        "microbatches": cfg.grad_accum,
    }
    rec = open_recorder(cfg, env, topology, groups, model, optimizer, params, layout)
    comm_delay_s = faults.comm_delay_s("dp")
    if rec.enabled:
        register_recording_hook(
            rec,  # type: ignore[arg-type]
            ddp,
            before_launch=(lambda: time.sleep(comm_delay_s)) if comm_delay_s else None,
        )
    elif comm_delay_s:
        ddp.register_comm_hook(None, delayed_allreduce_hook(comm_delay_s))

    samples_per_epoch = cfg.micro_batch * cfg.grad_accum * topology.dp * 4  # 4 steps an epoch
    dataset = SyntheticTokens(samples_per_epoch, cfg.seq, cfg.vocab, seed=cfg.seed)
    loader, sampler = make_loader(dataset, cfg.micro_batch, env.rank, topology.dp, cfg.seed)
    on_epoch = rec.event if rec.enabled else None  # a hash of each epoch's sample order
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
                    last = mb == cfg.grad_accum - 1
                    with contextlib.nullcontext() if last else ddp.no_sync():
                        with rec.span("fwd", mb=mb):
                            faults.apply_compute_delay(step_index)
                            _, loss = ddp(inputs, targets)
                            if leak is not None:
                                leak.step()
                        with rec.span("bwd", mb=mb):
                            (loss / cfg.grad_accum).backward()
                with rec.span("opt"):
                    if cfg.clip_grad is not None:
                        clip_gradients(rec, list(model.parameters()), cfg.clip_grad)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                step.loss = loss.item()
        failed = False
    finally:
        del ddp  # its reducer holds the last futures: freed before the groups go (shutdown)
        shutdown(rec, failed=failed)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_process(0)  # skip native teardown: see its docstring
