"""The README's "Instrumenting your own loop" block, run as written under torchrun.

    torchrun --standalone --nproc-per-node 2 tests/distributed/readme_job.py [--slow-rank R]
        [--then-broken]

The block expects a script around it that defines `net` (whose forward returns the loss),
`loader`, `torch` and `DDP`; this is that script: a small regression MLP on synthetic batches.
`--slow-rank R --slow-ms M` makes rank R's loader sleep M ms per batch (a slow data loader);
`--replace OLD NEW` edits the block first. The run directory is `runs/my-job` under the working
directory, as the block says. `--then-broken` runs the block a second time in `broken/`, with
the issue's bug (the forward through `net`, not the DDP wrapper) and parameter checksums on, all
loaders fast (one launch for both: starting torch costs more than either run).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Instrumenting your own loop"


def readme_block() -> str:
    """The first ```python block after the section heading."""
    text = README.read_text()
    section = text[text.index(SECTION) :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, f"no python block in {SECTION!r}"
    return match.group(1)


class Regression(nn.Module):
    """An MLP that learns a fixed linear teacher; forward returns the loss."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, 1))
        self.register_buffer("teacher", torch.linspace(-1, 1, 32).unsqueeze(1))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.body(batch), batch @ self.teacher)


def batches(steps: int, rank: int, slow_rank: int | None, slow_ms: float) -> Iterator[torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        if rank == slow_rank:
            time.sleep(slow_ms / 1000)  # a slow data loader: decoding, a remote read
        yield torch.randn(64, 32, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--replace", nargs=2, action="append", default=[])
    parser.add_argument("--then-broken", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    run_block(args.replace, batches(args.steps, dist.get_rank(), args.slow_rank, args.slow_ms))
    if args.then_broken:
        os.makedirs("broken", exist_ok=True)
        os.chdir("broken")
        run_block(BROKEN, batches(args.steps, dist.get_rank(), None, 0.0))
    dist.destroy_process_group()


# The bug, and the checksums that see the weights drift apart.
BROKEN = [
    ("loss = model(batch)", "loss = net(batch)"),
    (
        "register_recording_hook(rec, model)",
        "register_recording_hook(rec, model, checksum_every=2)",
    ),
]


def run_block(replacements: list[tuple[str, str]], loader: Iterator[torch.Tensor]) -> None:
    """The README block, edited by `replacements`, with this script's names in scope."""
    torch.manual_seed(0)
    block = readme_block()
    for old, new in replacements:
        assert old in block, f"{old!r} is not in the README block"
        block = block.replace(old, new)
    scope = {"torch": torch, "DDP": DDP, "net": Regression(), "loader": loader}
    exec(compile(block, f"{README}:{SECTION}", "exec"), scope)


if __name__ == "__main__":
    main()
