"""The context managers a Recorder hands out: a step, a span, a tag, a hand-timed collective.

They reach into their Recorder's state on purpose: they are its parts, kept in their own module
so each file stays small. Every bit of collector work inside them is guarded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from collectors.comm import CommEvent, context
from collectors.host import HostReading
from collectors.memory import grad_bytes
from collectors.safety import report_once

if TYPE_CHECKING:
    from collectors.recorder import Recorder


class StepContext:
    """One training step: spans inside it carry its index; memory is sampled when it ends."""

    def __init__(self, rec: Recorder, tokens: int | None) -> None:
        self.rec = rec
        self.tokens = tokens
        self.loss: Any = None
        self._t0 = 0
        self._hooks: Any = None
        self._host_at_start: Any = None

    def __enter__(self) -> StepContext:
        rec = self.rec
        try:
            step = rec.step_index
            rec._measuring_activations = rec._activations is not None and (
                step < 3 or step % rec.activation_every == 0
            )
            if rec._measuring_activations and rec._activations is not None:
                rec._activations.reset_peak()
                self._hooks = rec._activations.hooks()
                self._hooks.__enter__()
            if rec.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(rec.device)
            rec._grads_at_opt_bytes = None
        except Exception as err:
            report_once("Recorder.step enter", err)
        self._host_at_start = rec._host.read()
        self._t0 = rec.clock.now()
        if rec._fetch_t0 is not None:  # the batch came from `rec.iterate`: the step began there
            self._t0, rec._fetch_t0 = min(rec._fetch_t0, self._t0), None
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t1 = self.rec.clock.now()
        host = self.rec._host.read()  # before the step's own bookkeeping below
        try:
            self._finish(t1, exc, host)
        except Exception as err:
            report_once("Recorder.step exit", err)

    def _finish(self, t1: int, exc: Any, host: HostReading) -> None:
        rec = self.rec
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
        # Each sampler is guarded on its own: one that fails must not cost the step record.
        if isinstance(exc, torch.OutOfMemoryError):
            memory = _sampled("Recorder.memory_breakdown", rec.memory_breakdown) or {}
            rec.event("oom", message=str(exc).splitlines()[0][:500], **memory)
            rec.flush()
            return
        for callback in rec._step_end_callbacks:
            try:
                callback()
            except Exception as err:
                report_once("step-end callback", err)
        memory = _sampled("Recorder.memory_breakdown", rec.memory_breakdown)
        if memory is not None:
            if rec._grads_at_opt_bytes is not None:
                memory["grads"] = max(memory["grads"] or 0, rec._grads_at_opt_bytes)
            rec._writer.write({"kind": "mem", "step": rec.step_index, **memory})
            rec.check_memory_budget(memory)
        record: dict[str, Any] = {
            "kind": "step",
            "step": rec.step_index,
            "t0": self._t0,
            "t1": t1,
            "tokens": self.tokens,
            "loss": _sampled("step loss", _as_float, self.loss),
            **rec._host.step_fields(self._host_at_start, host),
        }
        if rec._nvml is not None:
            device = _sampled("NvmlSampler.sample", rec._nvml.sample)
            if device is not None:
                record["device"] = device
        if exc is None:
            rec._writer.write(record)
            rec.steps_completed += 1
        rec.flush()
        rec.step_index += 1


def _sampled(where: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or None (reported once) when it raises."""
    try:
        return fn(*args)
    except Exception as err:
        report_once(where, err)
        return None


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value.detach().item()) if torch.is_tensor(value) else float(value)
    return value if math.isfinite(value) else float("nan")


class SpanContext:
    def __init__(self, rec: Recorder, phase: str, mb: Any, stage: Any, chunk: Any) -> None:
        self.rec = rec
        self.record: dict[str, Any] = {
            "kind": "span",
            "step": rec.step_index,
            "phase": phase,
            "mb": mb,
            "stage": stage,
            "chunk": chunk,
            "t0": 0,
            "t1": 0,
        }
        self._event: Any = None
        self._outer_phase: str | None = None

    def __enter__(self) -> SpanContext:
        rec = self.rec
        self._outer_phase, rec.phase = rec.phase, self.record["phase"]
        try:
            if self.record["phase"] == "opt" and rec._params is not None:
                rec._grads_at_opt_bytes = grad_bytes(rec._params)
            if rec._cuda_timer is not None:
                self._event = rec._cuda_timer.start()
        except Exception as err:
            report_once("Recorder.span enter", err)
        self.record["t0"] = rec.clock.now()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.record["t1"] = self.rec.clock.now()
        self.rec.phase = self._outer_phase
        try:
            if self._event is not None and self.rec._cuda_timer is not None:
                self.rec._cuda_timer.stop(self.record, self._event)
            else:
                self.rec._writer.write(self.record)
        except Exception as err:
            report_once("Recorder.span exit", err)


class TagContext:
    def __init__(self, tag: str | None, expected_bytes: int | None) -> None:
        self.tag, self.expected_bytes = tag, expected_bytes
        self._saved: tuple[Any, Any] = (None, None)

    def __enter__(self) -> TagContext:
        self._saved = (context.tag, context.expected_bytes)
        context.tag, context.expected_bytes = self.tag, self.expected_bytes
        return self

    def __exit__(self, *exc: Any) -> None:
        context.tag, context.expected_bytes = self._saved


class CollectiveContext:
    def __init__(self, rec: Recorder, event: CommEvent) -> None:
        self.rec, self.event = rec, event

    def __enter__(self) -> CollectiveContext:
        context.depth += 1
        self.event.t0 = self.rec.clock.now()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.event.t1 = self.rec.clock.now()
        context.depth -= 1
        self.rec.record_comm_event(self.event)
