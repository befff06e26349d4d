"""The recorder's watchdog: a daemon thread that keeps a rank's file current while a step is
open, and writes what it can when the rank stops making progress.

- Every `heartbeat_s` without a flush (a step longer than that, or a rank stuck in one), it
  flushes the writer with the in-flight state (`step_open`, `span_open`, `comm_issued`) and a
  `heartbeat` event: the process is alive, and the file says where it is.
- When the rank made no progress (a step, span or collective starting or ending) for
  max(`stall_factor` x its median step, `stall_floor_s`), it writes one `stall` event per
  episode: the main thread's Python stack as data (`sys._current_frames()`, read from this
  thread, never from a signal handler) and PyTorch's Flight Recorder dump
  (`RUN/flight-recorder/rank-NNNNN.json`).

It never stops training: it takes no lock the training thread holds for more than an append
(its flush gives up after a moment if a training-thread flush holds the file), every error is
logged once and swallowed, and it holds its recorder weakly (a recorder dropped without
`close()` ends it).

Knobs (arguments of `Recorder` and `Recorder.from_env`, else the environment, else default):
`stall_factor` / DIAG_STALL_FACTOR (5), `stall_floor_s` / DIAG_STALL_FLOOR_S (10 s),
`heartbeat_s` / DIAG_HEARTBEAT_S (2 s); `watchdog=False` or DIAG_WATCHDOG=0 turns it off.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from collectors.clock import Clock
from collectors.host import own_thread
from collectors.inflight import InFlight
from collectors.safety import report_once

STACK_FRAMES = 64
"""The innermost frames of the main thread's stack a `stall` event keeps."""
FLUSH_TIMEOUT_S = 1.0
"""How long a watchdog flush waits for a training-thread flush that holds the file."""
FR_FOLDER = "flight-recorder"


@dataclass(frozen=True)
class WatchdogConfig:
    stall_factor: float = 5.0  # x the median step
    stall_floor_s: float = 10.0  # the least silence called a stall, seconds
    heartbeat_s: float = 2.0  # the flush period while a step is open, seconds

    @classmethod
    def resolve(
        cls,
        stall_factor: float | None = None,
        stall_floor_s: float | None = None,
        heartbeat_s: float | None = None,
    ) -> WatchdogConfig:
        """The arguments given, else DIAG_STALL_FACTOR, DIAG_STALL_FLOOR_S, DIAG_HEARTBEAT_S,
        else the defaults (a bad value in the environment is logged once, never fatal)."""
        return cls(
            stall_factor=_knob(stall_factor, "DIAG_STALL_FACTOR", cls.stall_factor),
            stall_floor_s=_knob(stall_floor_s, "DIAG_STALL_FLOOR_S", cls.stall_floor_s),
            heartbeat_s=_knob(heartbeat_s, "DIAG_HEARTBEAT_S", cls.heartbeat_s),
        )

    @property
    def poll_s(self) -> float:
        """How often the thread wakes: a fraction of the shortest period it watches."""
        return max(0.01, min(0.5, self.heartbeat_s / 2, self.stall_floor_s / 4))

    def threshold_s(self, median_step_s: float | None) -> float:
        """The silence after which a rank has stalled: its median step x the factor, at least
        the floor (the floor alone before any step completed)."""
        return max(self.stall_factor * (median_step_s or 0.0), self.stall_floor_s)


def _knob(given: float | None, env: str, default: float) -> float:
    if given is not None:
        value = float(given)
    else:
        raw = os.environ.get(env, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            report_once(env, ValueError(f"{env}={raw!r} is not a number; using {default}"))
            return default
    if not 0 < value < float("inf"):
        report_once(env, ValueError(f"{env}={value!r} must be > 0; using {default}"))
        return default
    return value


def watchdog_enabled(given: bool | None) -> bool:
    return given if given is not None else os.environ.get("DIAG_WATCHDOG", "1") != "0"


class Watched(Protocol):
    """The Recorder as its watchdog sees it."""

    inflight: InFlight
    clock: Clock
    rank: int
    run_dir: Path
    main_thread_id: int

    def flush_from_thread(self, records: list[dict[str, Any]], timeout_s: float) -> bool: ...


def main_stack(thread_id: int, limit: int = STACK_FRAMES) -> list[dict[str, Any]]:
    """The Python stack of thread `thread_id` as [{file, line, function}], innermost last (its
    `limit` innermost frames); [] when the thread is gone. Read from another thread."""
    frame = sys._current_frames().get(thread_id)
    frames: list[dict[str, Any]] = []
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        frames.append({"file": code.co_filename, "line": frame.f_lineno,
                       "function": code.co_name})  # fmt: skip
        frame = frame.f_back
    frames.reverse()
    return frames


def dump_flight_recorder(run_dir: Path, rank: int) -> tuple[str | None, str | None]:
    """PyTorch's Flight Recorder state as its own JSON, in RUN/flight-recorder/rank-NNNNN.json:
    (the path relative to `run_dir`, None) or (None, why there is none)."""
    try:
        from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
            _dump_fr_trace_json,
        )
    except ImportError as err:
        return None, f"this torch has no Flight Recorder JSON dump ({err})"
    try:
        text = _dump_fr_trace_json()
    except Exception as err:
        return None, f"_dump_fr_trace_json failed: {err!r}"[:500]
    folder = run_dir / FR_FOLDER
    name = f"rank-{rank:05d}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{name}.partial"
        partial.write_text(text if isinstance(text, str) else text.decode("utf-8"))
        os.replace(partial, folder / name)  # a reader never sees half a dump
    except OSError as err:  # a full disk, a read-only run directory
        return None, f"writing the dump failed: {err!r}"[:500]
    return f"{FR_FOLDER}/{name}", None


class Watchdog:
    """The thread; `tick()` is one look (the tests call it directly)."""

    def __init__(self, target: Watched, config: WatchdogConfig) -> None:
        self.config = config
        self._target = weakref.ref(target)
        self._stop = threading.Event()
        self._stalled_at: int | None = None  # the progress mark of the episode written
        self.stalls = 0
        self._thread = threading.Thread(target=self._run, name="diag-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        own_thread()
        while not self._stop.wait(self.config.poll_s):
            try:
                if not self.tick():
                    return
            except Exception as err:
                report_once("watchdog", err)

    def tick(self) -> bool:
        """Flush, heartbeat or write a stall if due; False once there is nothing to watch."""
        target = self._target()
        if target is None or target.inflight.closed:
            return False
        inflight = target.inflight
        if not inflight.active:
            return True
        now = target.clock.now()
        progress = inflight.progress_ns
        idle_s = (now - progress) / 1e9
        threshold_s = self.config.threshold_s(inflight.median_step_s())
        if idle_s >= threshold_s and self._stalled_at != progress:
            self._stalled_at = progress  # once per episode: again only after progress
            self.stalls += 1
            target.flush_from_thread([self._stall(target, now, idle_s, threshold_s)],
                                     FLUSH_TIMEOUT_S)  # fmt: skip
        elif now - inflight.flushed_ns >= self.config.heartbeat_s * 1e9:
            heartbeat = {"kind": "event", "step": inflight.step_index, "name": "heartbeat",
                         "t_ns": now, "interval_s": self.config.heartbeat_s}  # fmt: skip
            target.flush_from_thread([heartbeat], FLUSH_TIMEOUT_S)
        return True

    def _stall(
        self, target: Watched, now: int, idle_s: float, threshold_s: float
    ) -> dict[str, Any]:
        stack = main_stack(target.main_thread_id)
        fr_file, fr_error = dump_flight_recorder(target.run_dir, target.rank)
        return {
            "kind": "event",
            "step": target.inflight.step_index,
            "name": "stall",
            "t_ns": now,
            "idle_s": round(idle_s, 3),
            "threshold_s": round(threshold_s, 3),
            "stack": stack,
            "fr_file": fr_file,
            "fr_error": fr_error,
        }
