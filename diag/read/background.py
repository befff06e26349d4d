"""Work handed to a forked child, so that it runs on an idle core while this process goes on (the
cache's tables are written while the analysis runs: `diag.read.cache.write`).

The child works on a copy of this process's memory as it was at the fork (nothing the parent
changes afterwards reaches it), prints nothing (its standard streams go to /dev/null), never
raises into the parent and never returns into its code: it leaves by `os._exit`, its status
saying whether the work succeeded. The parent reaps its children when asked (`wait`) and, at
the latest, before it exits (an `atexit` hook), so a command that has returned has finished
its background work.

Where there is no `fork`, or another thread runs (a lock it holds would stay held in the
child), or the fork fails, `start` says so and the caller does the work itself.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Callable, Hashable

_children: dict[int, Hashable] = {}
"""Children not yet reaped: pid -> the tag their work was started under."""


def start(work: Callable[[], bool], tag: Hashable) -> bool:
    """Run `work` in a forked child (its status 0 when `work` returns True); False when no
    child could be started (the caller does the work)."""
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:  # the child: never back into the caller, whatever happens
        status = 1
        try:
            _silence()
            status = 0 if work() else 1
        except BaseException:  # an interrupt included: the parent goes on without the work
            pass
        finally:
            os._exit(status)
    _children[pid] = tag
    return True


def wait(tag: Hashable | None = None) -> list[int]:
    """Reap the children started under `tag` (every child when None), waiting for those still
    running; their exit statuses (0: the work succeeded)."""
    statuses = []
    for pid, child_tag in list(_children.items()):
        if tag is not None and child_tag != tag:
            continue
        del _children[pid]
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by someone else (a SIGCHLD handler)
            continue
        statuses.append(os.waitstatus_to_exitcode(status))
    return statuses


def pending(tag: Hashable | None = None) -> int:
    """How many children started under `tag` (every child when None) are not reaped yet."""
    return sum(1 for child_tag in _children.values() if tag is None or child_tag == tag)


atexit.register(wait)  # a process that exits normally has reaped every child first


def _silence() -> None:
    """Point the child's standard streams at /dev/null: nothing it might print mixes with the
    parent's output, and a pipe the parent writes to (a report piped to another command) is
    not held open by a child that outlives a killed parent."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
