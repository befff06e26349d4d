"""Python callbacks handed to torch futures, held until a communication thread lets go of them.

A callback given to `Future.then` or `add_done_callback` is owned by the future's C++ side and
dropped on the thread that completes the future: for gloo, a worker thread, a moment after the
waiting training thread has woken. Dropping it takes the GIL. If the interpreter has begun to
finalize by then (the training script returned right after its last collective), CPython ends
that thread with a forced unwind inside a destructor, and the process dies with `terminate
called without an active exception` (SIGABRT): a finished job reported as failed. So every
callback a collector hands over is counted until its function object is freed, and at exit
(atexit runs before finalization) the training thread waits, briefly and with the GIL
released, for the count to reach zero, then collects garbage: a cycle that holds a DDP model or
a communication future is freed while the interpreter is whole, not in its teardown.
"""

from __future__ import annotations

import atexit
import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

DRAIN_TIMEOUT_S = 2.0
"""How long exit waits for callbacks still owned by communication threads (a future that never
completes, a hung peer, must not hold the process)."""
_POLL_S = 0.001


class PendingCallbacks:
    """The callbacks handed to futures whose function objects are still alive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._alive: set[weakref.ref[Any]] = set()
        self.handed = 0  # callbacks tracked since the process started

    def track(self, callback: F) -> F:
        """`callback`, counted until the future that receives it frees it."""
        ref = weakref.ref(callback, self._freed)
        with self._lock:
            self._alive.add(ref)
            self.handed += 1
        return callback

    def _freed(self, ref: weakref.ref[Any]) -> None:
        with self._lock:
            self._alive.discard(ref)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._alive)

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Wait until no tracked callback is alive (sleeping releases the GIL the freeing
        threads need); False when some still are after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.count:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True


PENDING = PendingCallbacks()
"""The process's callbacks handed to futures by every collector."""


def _drain_at_exit() -> None:
    PENDING.drain()
    gc.collect()


atexit.register(_drain_at_exit)
