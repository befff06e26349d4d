"""Instrumenting your own training loop: the lines marked `# diag` (and the
`Recorder.from_env` call) are all it takes.

    torchrun --standalone --nproc-per-node 2 examples/own_loop.py --out runs/own-loop
    diag analyze runs/own-loop

The loop below is an ordinary DDP regression job (a small residual MLP on synthetic data); it
knows nothing of the reference trainers. `trace_collectives=True` records every collective the
process issues (here: a loss all-reduce for logging); `register_recording_hook` records DDP's
gradient all-reduces, which happen inside DDP where no Python function can see them (and names
DDP's group `dp`: the layout is dp=2 without saying so); `rec.iterate` records each batch fetch
as its step's `data` span (`--slow-loader-ms M` makes rank 1's loader slow: the main finding
then names rank 1). `--device cuda` runs it on GPUs (NCCL; `--backend gloo` lets more ranks
than GPUs share them, as benchmarks/gpu_check.py does).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from collectors import Recorder, register_recording_hook  # diag


class ResidualMLP(nn.Module):
    def __init__(self, width: int = 256, depth: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
            for _ in range(depth)
        )
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def batches(
    steps: int, batch: int, teacher: torch.Tensor, slow_ms: float
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic regression batches, different on every rank; rank 1 sleeps `slow_ms` each."""
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        if slow_ms and dist.get_rank() == 1:
            time.sleep(slow_ms / 1000)  # a slow data loader (decoding, a remote read)
        x = torch.randn(batch, 32, generator=generator)
        yield x, x @ teacher


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/own-loop")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--slow-loader-ms", type=float, default=0.0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--backend", default=None, help="gloo on CPU, nccl on CUDA by default")
    args = parser.parse_args()

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.device == "cuda":  # ranks beyond the GPUs share them (gloo only: NCCL refuses)
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend or ("nccl" if device.type == "cuda" else "gloo"))
    torch.manual_seed(0)
    net = ResidualMLP().to(device)
    model = DDP(net, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    teacher = torch.randn(32, 1)

    rec = Recorder.from_env(
        args.out, model=model, optimizer=optimizer, trace_collectives=True, device=device
    )  # on a GPU, `device` turns on CUDA-event timing, the allocator's figures and pynvml
    register_recording_hook(rec, model)  # diag

    loader = batches(args.steps, args.batch, teacher, args.slow_loader_ms)
    for x, y in rec.iterate(loader):  # diag
        x, y = x.to(device), y.to(device)
        with rec.step(tokens=args.batch) as step:  # diag
            with rec.span("fwd"):  # diag
                loss = nn.functional.mse_loss(model(x), y)
            with rec.span("bwd"):  # diag
                loss.backward()
            with rec.span("opt"):  # diag
                optimizer.step()
                optimizer.zero_grad()
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # recorded by trace_collectives
            step.loss = logged.item() / dist.get_world_size()  # diag
    rec.close()  # diag
    if dist.get_rank() == 0:
        print(f"wrote {os.path.abspath(args.out)}; analyse it with: diag analyze {args.out}")
    # Free DDP's model (and the autograd graph behind the loss) before the process group, not
    # at interpreter teardown, where gloo's threads may be the ones to free its last futures
    # and abort a finished job (docs/collectors.md, "Ending the job")
    del model, optimizer, loss, logged
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
