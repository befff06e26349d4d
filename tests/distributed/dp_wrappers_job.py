"""Data-parallel wrappers recorded with no layout given: DDP with a user's compression hook
(bf16 compression, then PowerSGD), then FSDP2, one after the other in one process.

    torchrun --standalone --nproc-per-node 2 tests/distributed/dp_wrappers_job.py OUT

Writes OUT/bf16, OUT/powersgd and OUT/fsdp (5 steps each). PowerSGD compresses from step 2
(`start_powerSGD_iter=2`, the least it allows with error feedback); before, it all-reduces
the bucket as it is. The ranks' weights are all-gathered at the end into OUT/*/weights.json:
the hook still synchronised them.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    bf16_compress_hook,
    fp16_compress_hook,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from collectors import Recorder, register_recording_hook
from collectors.fsdp import register_fsdp_recording

STEPS = 5


def train(out: Path, hook: object = None, hook_state: object = None, fsdp: bool = False) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    if fsdp:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        units = [(fully_shard(layer, mesh=mesh), i) for i, layer in enumerate(net[::2])]
        model: nn.Module = fully_shard(net, mesh=mesh)
    else:
        model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder.from_env(out, model=model, optimizer=opt)
    if fsdp:
        register_fsdp_recording(rec, [*units, (model, None)])
    else:
        register_recording_hook(rec, model, hook=hook, hook_state=hook_state)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for batch in rec.iterate(torch.randn(32, 64, generator=generator) for _ in range(STEPS)):
        with rec.step(tokens=batch.shape[0]):
            with rec.span("fwd"):
                loss = (model(batch) - batch).pow(2).mean()
            with rec.span("bwd"):
                loss.backward()
            with rec.span("opt"):
                opt.step()
                opt.zero_grad()
    rec.close()
    if fsdp:
        return
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    if dist.get_rank() == 0:
        spread = max(float((w - everyone[0]).abs().max()) for w in everyone)
        (out / "weights.json").write_text(json.dumps({"max_rank_difference": spread}))


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = Path(sys.argv[1])
    train(out / "bf16", bf16_compress_hook, None)
    state = powersgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
    )
    train(out / "powersgd", powersgd.powerSGD_hook, state)
    train(out / "fsdp", fsdp=True)
    # collectors off: the job's own hook is registered as DDP would (DDP refuses bf16 on CPU)
    model = DDP(nn.Linear(4, 4))
    register_recording_hook(
        Recorder.from_env(out / "off", enabled=False), model, hook=fp16_compress_hook
    )
    hooks = [hook.__name__ for hook, _ in model._comm_hooks]
    (out / f"off-hooks-{dist.get_rank()}.json").write_text(json.dumps(hooks))
    # a model whose hook was registered before diag's: it stays, unrecorded, and the run says so
    model = DDP(nn.Linear(4, 4))
    model.register_comm_hook(None, fp16_compress_hook)
    rec = Recorder.from_env(out / "hooked", model=model)
    assert register_recording_hook(rec, model) is None
    rec.close()
    # the models go before the process group, cycles too, as `reference_runs.common.shutdown`
    # explains: left to teardown, gloo's threads can free DDP's last futures and abort the
    # process after a complete run ("terminate called without an active exception", seen once)
    del model, rec
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
