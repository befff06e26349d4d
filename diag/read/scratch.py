"""A private scratch folder that a killed analysis does not leave behind for good (issue 43).

A large trace folder's packed records wait on disk while the layout is inferred (kineto/spill.py)
and `--replay all` writes a run's records a chunk of steps at a time (record_spill.py): both in
a folder of the system's temporary directory. A `with` block removes it on return, on an
exception and on Ctrl-C (KeyboardInterrupt); `owned_folder` also turns SIGTERM and SIGHUP into
an exit that unwinds the block (where this process had left them to their default action). A
SIGKILL, a crash of the interpreter or a power cut leaves it: the next analysis that makes a
folder of that kind removes the stale ones.

How a folder is known to be stale, and ours:
- **its owner holds a lock on it while it lives**: the folder's `lock` file is locked
  (`flock`, exclusive) by the process that made it, and kept locked by every process that
  inherits the descriptor (its forked workers) until the last of them exits, however it
  ends; the kernel releases it. Whoever can take that lock knows no process is using the
  folder. This holds across PID namespaces sharing one /tmp (containers), where a PID
  says nothing. The folder's name also carries the owner's PID and start time (for a person
  reading /tmp; and where the lock file is missing, the owner having died between making the
  folder and its lock, the owner is gone when that PID no longer runs with that start time,
  and the folder is older than `UNLOCKED_GRACE_S`);
- **only what diag makes is removed**: a directory (never a link to one: opened with
  O_NOFOLLOW, and the same inode as listed) named `<prefix><pid>-<start>-<random>`, owned by
  this user (never another user's), holding only regular files whose names that kind of
  folder writes (`names`); anything else in it, and the folder stays.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

LOCK_NAME = "lock"
UNLOCKED_GRACE_S = 600.0
"""A folder without its lock file is left this long (its owner may be about to lock it)."""
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals whose default action (end the process at once) would leave the folder."""


@contextlib.contextmanager
def owned_folder(prefix: str, names: str) -> Iterator[Path]:
    """A new private folder (mode 0700) in the temporary directory named `<prefix><pid>-<start
    time>-<random>`, locked for this process and its forked children; removed when the block
    ends however it ends but by SIGKILL (see the module). Before it is made, this user's
    folders of the same `prefix` whose owner is gone and that hold only files matching
    `names` (a regular expression) are removed."""
    remove_stale(prefix, names)
    me = os.getpid()
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{me}-{start_time(me)}-"))
    lock = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with _exit_signals_unwind():
            yield folder
    finally:
        _remove(folder, re.compile(names))
        os.close(lock)


def remove_stale(prefix: str, names: str) -> list[str]:
    """This user's folders of `prefix` in the temporary directory whose owner is gone, removed
    (see the module); their names."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-(\d+)-[A-Za-z0-9_]+")
    allowed = re.compile(names)
    root = tempfile.gettempdir()
    try:
        entries = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in entries:
        found = pattern.fullmatch(name)
        if found and _remove_if_stale(root, name, int(found[1]), int(found[2]), allowed):
            removed.append(name)
    return removed


def start_time(pid: int) -> int:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat's 22nd field); 0
    where that is not known (not Linux, no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        # the command's name, in parentheses, may hold spaces and parentheses itself
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def _remove_if_stale(root: str, name: str, pid: int, started: int, allowed: re.Pattern) -> bool:
    """The folder `name` of `root` removed when it is this user's, provably diag's and no
    process holds its lock; False where it stays."""
    try:
        listed = os.lstat(os.path.join(root, name))
        if not stat.S_ISDIR(listed.st_mode) or listed.st_uid != os.getuid():
            return False
        folder = os.open(os.path.join(root, name), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        opened = os.fstat(folder)
        if (opened.st_dev, opened.st_ino) != (listed.st_dev, listed.st_ino):
            return False  # replaced between the look and the opening
        try:
            lock = os.open(LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW, dir_fd=folder)
        except FileNotFoundError:
            if _owner_alive(pid, started) or time.time() - opened.st_mtime < UNLOCKED_GRACE_S:
                return False
            return _emptied(root, name, folder, allowed)
        except OSError:
            return False
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner, or a worker of it, is still running
            os.close(lock)
            return False
        try:  # the lock held while the folder goes: another cleaner finds it held, or gone
            return _emptied(root, name, folder, allowed)
        finally:
            os.close(lock)
    finally:
        os.close(folder)


def _emptied(root: str, name: str, folder: int, allowed: re.Pattern) -> bool:
    """The open folder's files removed and the folder itself, when every entry is a regular
    file of this user named as `allowed` says (or the lock); nothing removed otherwise."""
    try:
        entries = os.listdir(folder)
        for entry in entries:
            if entry != LOCK_NAME and not allowed.fullmatch(entry):
                return False
            found = os.stat(entry, dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid():
                return False
        for entry in entries:
            os.unlink(entry, dir_fd=folder)
        os.rmdir(os.path.join(root, name))  # an empty directory, never a link's target
    except OSError:
        return False
    return True


def _owner_alive(pid: int, started: int) -> bool:
    """Whether process `pid` runs and is the one that started at `started` (0: not known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that number
        return not started or start_time(pid) in (0, started)
    return not started or start_time(pid) in (0, started)


def _remove(folder: Path, allowed: re.Pattern) -> None:
    """The folder this process made, and what it holds (the files it and its workers wrote,
    without following a link), removed; nothing raised."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        for entry in os.listdir(handle):
            with contextlib.suppress(IsADirectoryError, PermissionError, FileNotFoundError):
                os.unlink(entry, dir_fd=handle)
    except OSError:
        pass
    finally:
        os.close(handle)
    with contextlib.suppress(OSError):
        folder.rmdir()


@contextlib.contextmanager
def _exit_signals_unwind() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise SystemExit(128 + the signal) in this process
    (its `with` blocks then remove what they made, and it exits as the signal would have it),
    where their action is the default one and this is the main thread; put back after. A
    process forked meanwhile has the default action back as it starts (`_default_in_child`);
    one forked before that hook ran acts as the default would."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def unwind(number: int, frame: FrameType | None) -> Any:
        if os.getpid() != owner:  # a forked worker: the default action
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        raise SystemExit(128 + number)

    before = {}
    for number in EXIT_SIGNALS:
        if signal.getsignal(number) is signal.SIG_DFL:
            before[number] = signal.signal(number, unwind)
            _UNWINDING[number] = unwind
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
            _UNWINDING.pop(number, None)


_UNWINDING: dict[int, Any] = {}
"""The exit signals whose handler this process set to unwind (`_exit_signals_unwind`)."""


def _default_in_child() -> None:
    """(In a forked child, as it starts) the exit signals this module handles back to their
    default action. A Python handler runs only when the child's main thread runs Python: a
    child stuck in C (a lock another thread of its parent held when it forked) would outlive
    SIGTERM, and a pool's `terminate()`, which sends it and then waits, would wait for ever
    (a replay's pool hung so once in CI, tests/unit/test_whatif_chunks.py; what held its
    worker was not recorded)."""
    for number, handler in list(_UNWINDING.items()):
        try:
            if signal.getsignal(number) is handler:
                signal.signal(number, signal.SIG_DFL)
        except ValueError:  # not the child's main thread: its handler acts as the default would
            return
    _UNWINDING.clear()


os.register_at_fork(after_in_child=_default_in_child)
