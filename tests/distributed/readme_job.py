"""The README's "Instrumenting your own loop" block, run as written under torchrun.

    torchrun --standalone --nproc-per-node 2 tests/distributed/readme_job.py [--slow-rank R]
        [--then-broken]

The block expects a script around it that defines `net` (whose forward returns the loss),
`loader`, `torch` and `DDP`; this is that script: a small regression MLP on synthetic batches.
`--slow-rank R --slow-ms M` makes rank R's loader sleep M ms per batch (a slow data loader);
`--replace OLD NEW` edits the block first. `--fail hang|crash|desync|kill --fail-rank R
--fail-step S` makes rank R's forward of step S sleep forever, raise, issue one all-reduce no
other rank issues (the group's order desynchronises), or SIGKILL its own process
(`--pg-timeout-s` then ends the job).
The run directory is `runs/my-job` under the working directory, as the block says.
`--then-broken` runs the block a second time in `broken/`, with the issue's bug (the forward
through `net`, not the DDP wrapper) and parameter checksums on, all loaders fast (one launch
for both: starting torch costs more than either run).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
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


class Failing(Regression):
    """The same model, whose forward of step `step` on rank `rank` hangs, raises, desynchronises
    the group's collectives or kills its process."""

    def __init__(self, kind: str, rank: int, step: int) -> None:
        super().__init__()
        self.kind, self.rank, self.step, self.calls = kind, rank, step, 0

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        step, self.calls = self.calls, self.calls + 1
        if step == self.step and dist.get_rank() == self.rank:
            if self.kind == "crash":
                raise RuntimeError(f"injected crash: rank {self.rank} at step {step}")
            if self.kind == "kill":  # a node lost, the OOM killer: no exception, no flush
                os.kill(os.getpid(), signal.SIGKILL)
            if self.kind == "desync":  # one collective the others never issue, then train on
                dist.all_reduce(torch.zeros(1))
                return super().forward(batch)
            while True:  # a deadlock, a stuck loader: the others wait in the all-reduce
                time.sleep(3600)
        return super().forward(batch)


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
    parser.add_argument("--fail", choices=["hang", "crash", "desync", "kill"], default=None)
    parser.add_argument("--fail-rank", type=int, default=0)
    parser.add_argument("--fail-step", type=int, default=0)
    parser.add_argument("--pg-timeout-s", type=float, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    timeout = None if args.pg_timeout_s is None else datetime.timedelta(seconds=args.pg_timeout_s)
    dist.init_process_group("gloo", timeout=timeout)
    net = Failing(args.fail, args.fail_rank, args.fail_step) if args.fail else None
    loader = batches(args.steps, dist.get_rank(), args.slow_rank, args.slow_ms)
    run_block(args.replace, loader, net)
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


def run_block(
    replacements: list[tuple[str, str]],
    loader: Iterator[torch.Tensor],
    net: nn.Module | None = None,
) -> None:
    """The README block, edited by `replacements`, with this script's names in scope (`net`:
    the model, by default a healthy Regression)."""
    torch.manual_seed(0)
    block = readme_block()
    for old, new in replacements:
        assert old in block, f"{old!r} is not in the README block"
        block = block.replace(old, new)
    scope = {"torch": torch, "DDP": DDP, "net": net or Regression(), "loader": loader}
    exec(compile(block, f"{README}:{SECTION}", "exec"), scope)


if __name__ == "__main__":
    main()
