"""What a dying process leaves in its rank files: the uncaught exception that ends it (chained
into `sys.excepthook`), and a flush when SIGTERM arrives (what torchrun sends before SIGKILL).

SIGTERM: the Python handler runs only when the main thread is back in the interpreter, which a
rank blocked inside a collective is not. So the handler does nothing but wait (briefly) and
chain: the flush happens on a helper thread woken by `signal.set_wakeup_fd`, which the
interpreter's C-level handler writes the signal number to at once, wherever the main thread
is. No stack is read and no lock is taken in the handler. Where the wakeup fd is already taken
(asyncio), the handler starts the helper itself. The previous handler runs afterwards, so
torchrun's behaviour is kept (the default: the process ends by SIGTERM).

A child forked from the process (a multiprocessing pool's worker) has none of the helper
threads and shares the wakeup pipe: in it, the previous handler is put back and the wakeup fd
let go at the fork, so SIGTERM ends the child at once (a pool's `terminate` waits on that) and
never wakes the parent's flush.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from collectors.host import own_thread
from collectors.safety import report_once

MESSAGE_CHARS = 2000
EXCEPTION_FRAMES = 20
SIGNAL_FLUSH_S = 2.0
"""How long the SIGTERM handler waits for the flush before chaining to the previous handler."""

_installed = False
_flushed = threading.Event()


def exception_fields(exc: BaseException, tb: TracebackType | None) -> dict[str, Any]:
    """An `exception` event's fields: type, message, the last frames of its traceback."""
    frames = traceback.extract_tb(tb)[-EXCEPTION_FRAMES:] if tb is not None else []
    return {
        "type": type(exc).__qualname__,
        "message": str(exc)[:MESSAGE_CHARS],
        "frames": [{"file": f.filename, "line": f.lineno, "function": f.name} for f in frames],
    }


def install(
    on_exception: Callable[[BaseException, TracebackType | None], None],
    on_signal: Callable[[int], None],
) -> None:
    """Chain `on_exception` into sys.excepthook and flush on SIGTERM, once per process. The
    SIGTERM part only from the main thread, and not over a handler installed outside Python."""
    global _installed
    if _installed:
        return
    _installed = True
    previous_hook = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            on_exception(exc, tb)
        except Exception as err:
            report_once("excepthook", err)
        previous_hook(kind, exc, tb)

    sys.excepthook = excepthook
    try:
        _install_sigterm(on_signal)
    except Exception as err:  # not the main thread, a platform without pipes or signals
        report_once("SIGTERM handler", err)


def _install_sigterm(on_signal: Callable[[int], None]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:  # a handler not installed from Python: leave it alone
        return

    def flush() -> None:
        try:
            on_signal(signal.SIGTERM)
        except Exception as err:
            report_once("SIGTERM flush", err)
        finally:
            _flushed.set()

    woken = _wakeup_thread(flush)
    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked child (if the reset at the fork did not run)
            _chain(previous, signum, frame)
            return
        if not woken:
            threading.Thread(target=flush, name="diag-sigterm", daemon=True).start()
        _flushed.wait(SIGNAL_FLUSH_S)
        _chain(previous, signum, frame)

    def in_child() -> None:
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, previous)
        except ValueError:  # forked from a thread other than the main one: the pid check
            pass

    signal.signal(signal.SIGTERM, handler)
    os.register_at_fork(after_in_child=in_child)


def _chain(previous: Any, signum: int, frame: Any) -> None:
    """What SIGTERM did before the collectors' handler: the previous Python handler, or the
    default (the process ends by the signal)."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # end as the default would have


def _wakeup_thread(flush: Callable[[], None]) -> bool:
    """A daemon thread that runs `flush` when SIGTERM's number arrives on the wakeup fd; False
    when the process already has a wakeup fd (then the handler starts the flush)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if old != -1:
        signal.set_wakeup_fd(old)
        os.close(read_fd)
        os.close(write_fd)
        return False

    def watch() -> None:
        own_thread()
        while True:
            data = os.read(read_fd, 64)
            if not data:
                return
            if signal.SIGTERM in data:
                flush()

    threading.Thread(target=watch, name="diag-signals", daemon=True).start()
    return True
