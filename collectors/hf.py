"""Hugging Face: `DiagTrainerCallback` records a `transformers.Trainer` run, and `recording`
does the same for a loop of your own (`accelerate`, or plain torch) as a context manager.

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[DiagTrainerCallback("runs/my-job")])
    trainer.train()

A step per optimizer step (from the previous step's end, so fetching its batches is in the
step cycle), `fwd` around each forward of the model (from before its first forward pre-hook,
so input processing users put there is forward time, to after its last forward hook; every
accumulation micro-batch has its own), `bwd` from there to the next forward or the optimizer,
`opt` around `optimizer.step()`, tokens from the `input_ids` the forwards saw, the loss from
the last forward's output; the Trainer's DDP model (`trainer.model_wrapped`) gets the recording
hook (its gradient all-reduces, its group `dp`, dp = its size). The Trainer calls its
callbacks with the inner model only, so the callback finds the Trainer that calls it on the
call stack (or takes it as `trainer`, as in `trainer.add_callback(DiagTrainerCallback(path,
trainer))`); a distributed job whose DDP model cannot be found is said once, loudly, on the
rank's log and in the run (a `grad_sync_unrecorded` event the report notes), never recorded
as dp=1 silently. transformers is imported only here (the `hf` extra).

    with recording("runs/my-job", model, optimizer) as rec:   # after accelerator.prepare
        for batch in rec.iterate(loader):
            with rec.step(tokens=batch["input_ids"].numel()):
                ...
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer, TrainerCallback

from collectors.ddp import register_recording_hook
from collectors.framework import HookedSteps, output_loss
from collectors.null import NullRecorder
from collectors.recorder import Recorder
from collectors.safety import report_once
from diag.contract.schema import RunStatus

log = logging.getLogger("collectors")
CALLER_DEPTH = 12
"""Frames above the callback searched for the Trainer that calls it (the Trainer's
`_inner_training_loop` is 3-4 frames up: callback handler, call_event)."""


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
        options = {"trainer": "hf", **self.recorder_options}
        self.rec = Recorder.from_env(self.run_dir, model=model, optimizer=optimizer, **options)
        self._steps = HookedSteps(self.rec)
        try:
            trainer = self.trainer if self.trainer is not None else _calling_trainer()
            wrapped = getattr(trainer, "model_wrapped", None)
            if isinstance(wrapped, DistributedDataParallel) and isinstance(self.rec, Recorder):
                register_recording_hook(self.rec, wrapped, checksum_every=self.checksum_every)
            elif isinstance(self.rec, Recorder) and _distributed_world() > 1:
                self._say_unrecorded(wrapped)
            if isinstance(model, torch.nn.Module) and self.rec.enabled:
                # the span opens before any pre-hook of the user's and closes after their
                # forward hooks: all of the model's forward call is forward time
                self._hooks = [
                    model.register_forward_pre_hook(
                        self._forward_begins, with_kwargs=True, prepend=True
                    ),
                    model.register_forward_hook(self._forward_ends, always_call=True),
                ]
        except Exception as err:  # never stop training for the recorder's sake
            report_once("DiagTrainerCallback.on_train_begin", err)

    def _say_unrecorded(self, wrapped: Any) -> None:
        """A distributed job whose DDP model was not found: loudly, once, and in the run."""
        what = type(wrapped).__name__ if wrapped is not None else "no Trainer found"
        why = f"the Trainer's DDP model was not found ({what})"
        self.rec.event("grad_sync_unrecorded", reason=why)
        log.warning(
            "DiagTrainerCallback: %s; the run records no gradient all-reduce. Pass the "
            "Trainer: trainer.add_callback(DiagTrainerCallback(path, trainer))",
            why,
        )

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


def _calling_trainer() -> Trainer | None:
    """The transformers Trainer whose method is on the call stack above (the callback is
    called from its training loop), None if none is within CALLER_DEPTH frames."""
    frame = sys._getframe(1)
    for _ in range(CALLER_DEPTH):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _distributed_world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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
    options = {"trainer": "hf", **recorder_options}
    rec = Recorder.from_env(run_dir, model=inner, optimizer=optimizer, **options)
    if isinstance(model, DistributedDataParallel) and isinstance(rec, Recorder):
        register_recording_hook(rec, model, checksum_every=checksum_every)
    try:
        yield rec
    except BaseException:
        rec.close(RunStatus.FAILED.value)
        raise
    rec.close()
