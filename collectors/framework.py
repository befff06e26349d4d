"""What the framework callbacks (collectors/lightning.py, collectors/hf.py) share: a step and
its spans opened and closed from separate hooks, and reading tokens and loss off a batch.

A framework calls one hook where a phase begins and another where it ends, so the recorder's
context managers are entered and exited by hand here; `HookedSteps` keeps at most one step and
one span open and closes whatever is open before opening the next (a hook a framework skips,
such as backward on a step whose loss is not finite, leaves no span open across steps).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from collectors.null import NullRecorder
from collectors.safety import report_once

if TYPE_CHECKING:
    from collectors.recorder import Recorder


class HookedSteps:
    """A recorder's steps and spans driven by a framework's hooks."""

    def __init__(self, rec: Recorder | NullRecorder) -> None:
        self.rec = rec
        self._step: Any = None
        self._span: Any = None
        self._last_end_ns: int | None = None

    def begin_step(self, tokens: int | None) -> None:
        """Open a step; it starts where the previous one ended, so the framework's work between
        steps (fetching the next batch, logging) is inside a step cycle: host time."""
        self.end_step()
        try:
            if self._last_end_ns is not None and not isinstance(self.rec, NullRecorder):
                self.rec.parts.fetch_t0 = self._last_end_ns
            self._step = self.rec.step(tokens=tokens)
            self._step.__enter__()
        except Exception as err:
            report_once("HookedSteps.begin_step", err)
            self._step = None

    def span(self, phase: str | None) -> None:
        """Close the open span, then open `phase` (None: only close)."""
        if self._span is not None:
            span, self._span = self._span, None
            span.__exit__(None, None, None)
        if phase is not None and self._step is not None:
            self._span = self.rec.span(phase)
            self._span.__enter__()

    def set_tokens(self, tokens: int | None) -> None:
        """The open step's tokens, when they are known only at its end."""
        if self._step is not None and tokens is not None:
            self._step.tokens = tokens

    def end_step(self, loss: Any = None, failed: BaseException | None = None) -> None:
        self.span(None)
        if self._step is None:
            return
        step, self._step = self._step, None
        if loss is not None:
            step.loss = loss
        step.__exit__(type(failed) if failed else None, failed, None)
        if not isinstance(self.rec, NullRecorder):
            self._last_end_ns = self.rec.clock.now()


def batch_tokens(batch: Any) -> int | None:
    """Tokens in a batch: the element count of its token ids (`input_ids`, else the first
    integer tensor), else the first tensor's leading dimension (samples); None if no tensor
    (or a batch of a shape this cannot read: the step is recorded without tokens)."""
    try:
        return _batch_tokens(batch)
    except Exception as err:
        report_once("batch_tokens", err)
        return None


def _batch_tokens(batch: Any) -> int | None:
    if isinstance(batch, Mapping) and torch.is_tensor(batch.get("input_ids")):
        return int(batch["input_ids"].numel())
    tensors = _tensors(batch)
    for t in tensors:
        if not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool:
            return int(t.numel())
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else None


def _tensors(batch: Any, depth: int = 0) -> list[torch.Tensor]:
    if torch.is_tensor(batch):
        return [batch]
    if depth > 3:  # a batch is shallow; a deeper structure is not worth walking every step
        return []
    items = batch.values() if isinstance(batch, Mapping) else batch
    if not isinstance(items, list | tuple) and not isinstance(batch, Mapping):
        return []
    return [t for item in items for t in _tensors(item, depth + 1)]


def output_loss(outputs: Any) -> Any:
    """The loss in a training step's output: the tensor itself, or its `loss` entry."""
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    return outputs if torch.is_tensor(outputs) else getattr(outputs, "loss", None)
