"""A tiny Lightning fit on 2 CPU ranks (Lightning's own DDP launcher), recorded by DiagCallback
and traced by Lightning's PyTorchProfiler.

    python tests/distributed/lightning_job.py OUT

Writes the run directory OUT/run and the profiler traces OUT/traces (as Lightning names them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from collectors.lightning import DiagCallback

STEPS = 5


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 1))

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * 2 * 16, 32, generator=generator)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)
    profiler = PyTorchProfiler(
        dirpath=out / "traces", filename="trace", export_to_chrome=True,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
    )  # fmt: skip
    trainer = pl.Trainer(
        strategy="ddp", accelerator="cpu", devices=2, max_steps=STEPS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[DiagCallback(out / "run")], profiler=profiler,
    )  # fmt: skip
    trainer.fit(Regression(), data)


if __name__ == "__main__":
    main()
