"""How a Recorder (collectors/recorder.py) ends: its flushes (the open state before each, from the
training thread or another), the `exception` and `signal` events of a rank about to die, and
`close` (the `rank_closed` event, the manifest's status). The recorders not yet closed are
kept here, weakly, so that exit, an uncaught exception and SIGTERM reach each of them
(collectors/exits.py installs the hooks)."""

from __future__ import annotations

import atexit
import signal
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import torch.distributed as dist

from collectors.clock import Clock
from collectors.comm import CollectiveTracer
from collectors.exits import exception_fields
from collectors.exits import install as install_exit_hooks
from collectors.inflight import InFlight
from collectors.parts import RecorderParts
from collectors.pending import PENDING
from collectors.safety import guarded, report_once
from collectors.watchdog import Watchdog, dump_flight_recorder
from diag.contract.schema import RunStatus, write_manifest


class RecorderEnd:
    """The Recorder's flushes and end (a part of the class: `Recorder(RecorderEnd)`); the
    attributes below are the Recorder's, set in its `__init__`."""

    parts: RecorderParts
    inflight: InFlight
    clock: Clock
    run_dir: Path
    rank: int
    step_index: int
    steps_completed: int
    _closed: bool
    _watchdog: Watchdog | None
    _tracer: CollectiveTracer | None
    _close_callbacks: list[Callable[[], None]]
    _manifest: Any

    def event(self, name: str, **fields: Any) -> None:
        raise NotImplementedError  # the Recorder's

    @guarded()
    def flush(self) -> None:
        if self.parts.cuda_timer is not None:
            for record in self.parts.cuda_timer.resolve():
                self.parts.writer.write(record)
        self._write_open_state()
        self.parts.writer.flush()
        self.inflight.flushed_ns = self.clock.now()

    def _write_open_state(self) -> None:
        """What is still open (step, spans, issued collectives), before each flush."""
        if self.inflight.any_open():
            for record in self.inflight.open_records():
                self.parts.writer.write(record)

    def flush_from_thread(self, records: list[dict[str, Any]], timeout_s: float) -> bool:
        """Write `records` and the open state, and flush, from a thread that is not the
        training thread (the watchdog, the SIGTERM flush): the flush gives up after
        `timeout_s` if a training-thread flush holds the file (the records go out with the
        next one). Never raises."""
        try:
            for record in records:
                self.parts.writer.write(record)
            self._write_open_state()
            done = self.parts.writer.flush(timeout_s=timeout_s)
            if done:
                self.inflight.flushed_ns = self.clock.now()
            return done
        except Exception as err:
            report_once("Recorder.flush_from_thread", err)
            return False

    _recorded_exception: tuple[int, str] | None = None

    @guarded()
    def record_exception(self, exc: BaseException, tb: TracebackType | None) -> None:
        """An `exception` event (type, message, last frames) for an exception leaving the
        training loop, flushed at once: the process may be about to die. Once per exception
        (the step context and sys.excepthook both see it)."""
        if isinstance(exc, (SystemExit, GeneratorExit)):
            return
        mark = (id(exc), type(exc).__qualname__)
        if self._closed or mark == self._recorded_exception:
            return
        self._recorded_exception = mark
        fields = exception_fields(exc, tb)
        if dist.is_available() and dist.is_initialized():
            # the collectives' state as PyTorch saw it when this rank failed (a peer lost
            # mid-collective ends the survivors with an error here, before any stall)
            fields["fr_file"], fields["fr_error"] = dump_flight_recorder(self.run_dir, self.rank)
        self.event("exception", t_ns=self.clock.now(), **fields)
        self.flush()

    def record_signal(self, signum: int) -> None:
        """A `signal` event, flushed (from the SIGTERM helper thread: collectors/exits.py)."""
        if self._closed:
            return
        event = {"kind": "event", "step": self.step_index, "name": "signal",
                 "t_ns": self.clock.now(), "signal": signal.Signals(signum).name}  # fmt: skip
        self.flush_from_thread([event], timeout_s=1.0)

    @guarded()
    def close(self, status: str = RunStatus.COMPLETE.value) -> None:
        if self._closed:
            return
        self._closed = True
        _OPEN_RECORDERS.discard(self)
        self.inflight.closed = True
        if self._watchdog is not None:
            self._watchdog.stop()
        # The callbacks handed to communication futures (the tracer's, the DDP hook's) write
        # records and are freed on backend threads: wait for them here, before the writer
        # closes and before the user destroys the process group (collectors/pending.py)
        PENDING.drain()
        for callback in self._close_callbacks:
            try:
                callback()
            except Exception as err:
                report_once("close callback", err)
        if self._tracer is not None:
            self._tracer.uninstall()
        if self.parts.cuda_timer is not None:
            for record in self.parts.cuda_timer.resolve(wait=True):
                self.parts.writer.write(record)
        self._write_open_state()  # whatever never completed (a failed run's last collective)
        self.event("rank_closed", t_ns=self.clock.now(),
                   status="failed" if status == RunStatus.FAILED.value else "complete")  # fmt: skip
        self.parts.writer.close()
        self.parts.host.close()
        if self._manifest is not None:
            self._manifest.status = status
            self._manifest.steps_completed = self.steps_completed
            write_manifest(self.run_dir, self._manifest)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None:
            self.record_exception(exc, tb)
        self.close(RunStatus.FAILED.value if exc_type else RunStatus.COMPLETE.value)


_OPEN_RECORDERS: weakref.WeakSet[RecorderEnd] = weakref.WeakSet()
"""Recorders not yet closed; held weakly, so that exit does not keep a recorder (nor what it
measures) alive past the user's own teardown."""


def _flush_open_recorders() -> None:
    """At exit, flush the records of recorders the job never closed."""
    for recorder in list(_OPEN_RECORDERS):
        recorder.flush()


atexit.register(_flush_open_recorders)


def _record_uncaught(exc: BaseException, tb: TracebackType | None) -> None:
    """sys.excepthook's part: the exception that ends the process, in every open recorder."""
    for recorder in list(_OPEN_RECORDERS):
        recorder.record_exception(exc, tb)


def _flush_on_signal(signum: int) -> None:
    for recorder in list(_OPEN_RECORDERS):
        recorder.record_signal(signum)


def track_open(recorder: RecorderEnd) -> None:
    """Keep `recorder` among the open ones until it closes, with the exit hooks installed."""
    _OPEN_RECORDERS.add(recorder)
    install_exit_hooks(_record_uncaught, _flush_on_signal)
