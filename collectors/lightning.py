"""PyTorch Lightning: `DiagCallback` records a `Trainer.fit` into a run directory.

    from collectors.lightning import DiagCallback
    trainer = lightning.Trainer(strategy="ddp", callbacks=[DiagCallback("runs/my-job")])
    trainer.fit(model, loader)

Through Lightning's hooks: a step per training batch (from the previous batch's end, so the
next batch's fetch is in the step cycle), `fwd` from the batch start to `on_before_backward`,
`bwd` to `on_after_backward`, `opt` from `on_before_optimizer_step` to the batch end; the
recorder opens when fit starts (the strategy has wrapped the model by then), every rank at
once, and registers the DDP strategy's model (`register_recording_hook`: its gradient
all-reduces, its group named `dp`, dp = its size); memory in the six categories at every step
end. Each training batch is a step: with `accumulate_grad_batches=k` only every k-th has an
`opt` span and gradient all-reduces. A `ddp_comm_hook` given to the strategy is registered by
Lightning first, so it runs unrecorded (a `grad_sync_unrecorded` event says so). Lightning is
imported only here (the `lightning` extra).
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from torch.nn.parallel import DistributedDataParallel

from collectors.ddp import register_recording_hook
from collectors.framework import HookedSteps, batch_tokens, output_loss
from collectors.null import NullRecorder
from collectors.recorder import Recorder
from collectors.safety import report_once
from diag.contract.schema import RunStatus


class DiagCallback(pl.Callback):
    """Records the fit's steps, spans, DDP collectives and memory to `run_dir`.

    `recorder_options` go to `Recorder.from_env` (`trace_collectives=True`, `layout=...`,
    `hardware=...`); `checksum_every=N` all-gathers a parameter checksum every N steps.
    """

    def __init__(
        self, run_dir: str | os.PathLike[str], *, checksum_every: int = 0, **recorder_options: Any
    ) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.checksum_every = checksum_every
        self.recorder_options = recorder_options
        self.rec: Recorder | NullRecorder = NullRecorder()
        self._steps = HookedSteps(self.rec)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        options = {"trainer": "lightning", **self.recorder_options}
        self.rec = Recorder.from_env(self.run_dir, model=pl_module, optimizer=optimizer, **options)
        self._steps = HookedSteps(self.rec)
        wrapped = trainer.strategy.model
        try:
            if isinstance(wrapped, DistributedDataParallel) and isinstance(self.rec, Recorder):
                register_recording_hook(self.rec, wrapped, checksum_every=self.checksum_every)
        except Exception as err:  # never stop the fit for the recorder's sake
            report_once("DiagCallback.on_fit_start", err)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._steps.begin_step(batch_tokens(batch))
        self._steps.span("fwd")

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any
    ) -> None:
        self._steps.span("bwd")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._steps.span(None)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self._steps.span("opt")

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._steps.end_step(loss=output_loss(outputs))

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._steps.end_step(failed=exception)
        self.rec.close(RunStatus.FAILED.value)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._steps.end_step()
        self.rec.close()
