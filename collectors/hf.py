"""Hugging Face: `DiagTrainerCallback` records a `transformers.Trainer` run, and `recording`
does the same for a loop of your own (`accelerate`, or plain torch) as a context manager.

    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(DiagTrainerCallback("runs/my-job", trainer))
    trainer.train()

A step per optimizer step (from the previous step's end, so fetching its batches is in the
step cycle), `fwd` around each forward of the model (a forward hook, so every accumulation
micro-batch has its own), `bwd` from there to the next forward or the optimizer,
`opt` around `optimizer.step()`, tokens from the `input_ids` the forwards saw, the loss from
the last forward's output; the Trainer's DDP model (`trainer.model_wrapped`) gets the recording
hook (its gradient all-reduces, its group `dp`, dp = its size). The Trainer calls its
callbacks with the inner model only, hence the `trainer` argument; without it the run has no
gradient collectives. transformers is imported only here (the `hf` extra).

    with recording("runs/my-job", model, optimizer) as rec:   # after accelerator.prepare
        for batch in rec.iterate(loader):
            with rec.step(tokens=batch["input_ids"].numel()):
                ...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import TrainerCallback

from collectors.ddp import register_recording_hook
from collectors.framework import HookedSteps, output_loss
from collectors.null import NullRecorder
from collectors.recorder import Recorder
from collectors.safety import report_once
from diag.schema import RunStatus


class DiagTrainerCallback(TrainerCallback):
    """Records a Trainer's steps, spans, DDP collectives and memory to `run_dir`.

    `recorder_options` go to `Recorder.from_env` (`trace_collectives=True`, `layout=...`).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        trainer: Any = None,
        *,
        checksum_every: int = 0,
        **recorder_options: Any,
    ) -> None:
        self.run_dir = run_dir
        self.trainer = trainer
        self.checksum_every = checksum_every
        self.recorder_options = recorder_options
        self.rec: Recorder | NullRecorder = NullRecorder()
        self._steps = HookedSteps(self.rec)
        self._hooks: list[Any] = []
        self._tokens = 0
        self._loss: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        self.rec = Recorder.from_env(
            self.run_dir, model=model, optimizer=optimizer, **self.recorder_options
        )
        self._steps = HookedSteps(self.rec)
        try:
            wrapped = getattr(self.trainer, "model_wrapped", None)
            if isinstance(wrapped, DistributedDataParallel) and isinstance(self.rec, Recorder):
                register_recording_hook(self.rec, wrapped, checksum_every=self.checksum_every)
            if isinstance(model, torch.nn.Module) and self.rec.enabled:
                self._hooks = [
                    model.register_forward_pre_hook(self._forward_begins, with_kwargs=True),
                    model.register_forward_hook(self._forward_ends),
                ]
        except Exception as err:  # never stop training for the recorder's sake
            report_once("DiagTrainerCallback.on_train_begin", err)

    def _forward_begins(self, module: Any, args: Any, kwargs: Mapping[str, Any]) -> None:
        if module.training:
            ids = kwargs.get("input_ids", args[0] if args else None)
            self._tokens += int(ids.numel()) if torch.is_tensor(ids) else 0
            self._steps.span("fwd")

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        if module.training:
            self._loss = output_loss(output)
            self._steps.span("bwd")  # the Trainer's training_step goes on to backward

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._tokens, self._loss = 0, None
        self._steps.begin_step(tokens=None)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._steps.span("opt")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._steps.span(None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._steps.set_tokens(self._tokens or None)
        loss = self._loss.detach() if torch.is_tensor(self._loss) else self._loss
        self._steps.end_step(loss=loss)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._steps.end_step()
        for hook in self._hooks:
            hook.remove()
        self.rec.close()


@contextlib.contextmanager
def recording(
    run_dir: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    checksum_every: int = 0,
    **recorder_options: Any,
) -> Iterator[Recorder | NullRecorder]:
    """A recorder for the loop inside, its DDP model registered (pass the model as
    `accelerator.prepare` returned it), closed at the end: failed if the loop raised."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    rec = Recorder.from_env(run_dir, model=inner, optimizer=optimizer, **recorder_options)
    if isinstance(model, DistributedDataParallel) and isinstance(rec, Recorder):
        register_recording_hook(rec, model, checksum_every=checksum_every)
    try:
        yield rec
    except BaseException:
        rec.close(RunStatus.FAILED.value)
        raise
    rec.close()
