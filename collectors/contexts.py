"""The context managers a Recorder hands out: a step, a span, a tag, a hand-timed collective.

They reach their Recorder through `StepOwner` (its public face) and `RecorderParts` (the writer,
samplers and per-step values it shares with them: collectors/parts.py), never through its
private attributes. Every bit of collector work inside them is guarded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from collectors.comm import CommEvent, context
from collectors.host import HostReading
from collectors.memory import grad_bytes
from collectors.parts import StepOwner
from collectors.safety import report_once


class StepContext:
    """One training step: spans inside it carry its index; memory is sampled when it ends."""

    def __init__(self, rec: StepOwner, tokens: int | None) -> None:
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
            rec.parts.measuring_activations = rec.parts.activations is not None and (
                step < 3 or step % rec.activation_every == 0
            )
            if rec.parts.measuring_activations and rec.parts.activations is not None:
                rec.parts.activations.reset_peak()
                self._hooks = rec.parts.activations.hooks()
                self._hooks.__enter__()
            if rec.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(rec.device)
            rec.parts.grads_at_opt_bytes = None
        except Exception as err:
            report_once("Recorder.step enter", err)
        self._host_at_start = rec.parts.host.read()
        self._t0 = rec.clock.now()
        if rec.parts.fetch_t0 is not None:  # the batch came from `rec.iterate`: it began there
            self._t0, rec.parts.fetch_t0 = min(rec.parts.fetch_t0, self._t0), None
        inflight = rec.inflight  # the step is open: the watchdog watches it
        inflight.step_index, inflight.step_t0 = rec.step_index, self._t0
        inflight.progress_ns = max(inflight.progress_ns, self._t0)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t1 = self.rec.clock.now()
        host = self.rec.parts.host.read()  # before the step's own bookkeeping below
        inflight = self.rec.inflight
        inflight.step_t0, inflight.progress_ns = None, t1
        if exc is None:
            inflight.step_ns.append(t1 - self._t0)
        elif not isinstance(exc, torch.OutOfMemoryError):  # an OOM has its own event
            self.rec.record_exception(exc, tb)  # before the step's flush: the process may die
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
        for callback in rec.parts.step_end_callbacks:
            try:
                callback()
            except Exception as err:
                report_once("step-end callback", err)
        memory = _sampled("Recorder.memory_breakdown", rec.memory_breakdown)
        if memory is not None:
            if rec.parts.grads_at_opt_bytes is not None:
                memory["grads"] = max(memory["grads"] or 0, rec.parts.grads_at_opt_bytes)
            rec.parts.writer.write({"kind": "mem", "step": rec.step_index, **memory})
            rec.check_memory_budget(memory)
        record: dict[str, Any] = {
            "kind": "step",
            "step": rec.step_index,
            "t0": self._t0,
            "t1": t1,
            "tokens": self.tokens,
            "loss": _sampled("step loss", _as_float, self.loss),
            **rec.parts.host.step_fields(self._host_at_start, host),
        }
        if rec.parts.nvml is not None:
            device = _sampled("NvmlSampler.sample", rec.parts.nvml.sample)
            if device is not None:
                record["device"] = device
        if exc is None:
            rec.parts.writer.write(record)
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
    def __init__(self, rec: StepOwner, phase: str, mb: Any, stage: Any, chunk: Any) -> None:
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
            if self.record["phase"] == "opt" and rec.parts.params is not None:
                rec.parts.grads_at_opt_bytes = grad_bytes(rec.parts.params)
            if rec.parts.cuda_timer is not None:
                self._event = rec.parts.cuda_timer.start()
        except Exception as err:
            report_once("Recorder.span enter", err)
        self.record["t0"] = t0 = rec.clock.now()
        rec.inflight.spans[id(self)] = self.record  # open: the watchdog's flushes write it
        rec.inflight.progress_ns = max(rec.inflight.progress_ns, t0)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.record["t1"] = t1 = self.rec.clock.now()
        self.rec.inflight.spans.pop(id(self), None)
        self.rec.inflight.progress_ns = t1
        self.rec.phase = self._outer_phase
        try:
            if self._event is not None and self.rec.parts.cuda_timer is not None:
                self.rec.parts.cuda_timer.stop(self.record, self._event)
            else:
                self.rec.parts.writer.write(self.record)
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
    def __init__(self, rec: StepOwner, event: CommEvent) -> None:
        self.rec, self.event = rec, event

    def __enter__(self) -> CollectiveContext:
        context.depth += 1
        self.event.t0 = self.rec.clock.now()
        self.rec.comm_issued(self.event)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.event.t1 = self.rec.clock.now()
        context.depth -= 1
        if exc[0] is not None:
            # it raised (the group's timeout, a peer gone, a mismatch): it never completed,
            # so it stays issued in the in-flight state the exit's flush writes
            return
        self.rec.record_comm_event(self.event)
