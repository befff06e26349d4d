"""Loops compiled with numba where the input is large enough to need it.

The loops (the what-if replay and its scan of waits, the time breakdown's interval unions) are
written once, as plain Python over numpy arrays that numba compiles unchanged. Small inputs
(the tests, a few ranks, a trace folder's attribution) run them as Python: importing numba and
loading its compiled code costs 0.4-0.8 s and 100 MiB, more than such loops take
(`PYTHON_EVENTS`).

Compiled code is cached on disk by numba (`cache=True`), so a process loads the loops instead of
compiling them: beside this package (`__pycache__`) when its folder is writable, else in this
user's cache folder (`$NUMBA_CACHE_DIR` when set, else `$XDG_CACHE_HOME/diag/numba`, default
`~/.cache/diag/numba`; `use_user_cache_folder`, run when this module is imported, before numba
is). numba's cache entries are pickles: both folders are this user's own, written by this
user's runs only; nothing of a run directory or a trace is compiled or loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

PYTHON_EVENTS = 400_000
"""The events a process runs through the loops as plain Python before it compiles them: about
what importing numba and loading the cached loops costs (0.4-0.8 s here; the replay as Python
takes about 1 us an event over lists, compiled about 0.01 us). Paying that once the Python time
would pass it (renting until the rent reaches the price) spends at most twice the better choice
made in hindsight: a trace folder's attribution (6-9 replays of 6,000-36,000 events) stays
Python, and about 100 MiB of memory less."""
COMPILE_FROM_EVENTS = 60_000
"""A loop given this many events compiles at once: a timeline is replayed several times (6-9
for a trace folder, a few dozen for a run's scenarios), so this many events a replay pass
PYTHON_EVENTS within a few replays (a large run's hundreds of thousands an event set)."""
CACHE_ENV = "NUMBA_CACHE_DIR"


def numba_cache_dir() -> Path:
    """Where numba caches the compiled loops: $NUMBA_CACHE_DIR, else this user's cache folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diag" / "numba"


def use_user_cache_folder(package: Path = Path(__file__).parents[1]) -> Path | None:
    """Where numba is to cache the loops when not beside `package` (diag): this user's cache
    folder, named in $NUMBA_CACHE_DIR (which numba reads when imported), when the package's
    folder is read-only or $NUMBA_CACHE_DIR is set; None: beside the package."""
    if not os.environ.get(CACHE_ENV) and os.access(package, os.W_OK):
        return None
    os.environ[CACHE_ENV] = str(numba_cache_dir())
    return Path(os.environ[CACHE_ENV])


use_user_cache_folder()


_loaded: set[Callable[..., Any]] = set()
"""The loops compiled (or loaded) in this process (a loader prepares them before forking its
workers, which inherit them)."""


_python_events = 0
"""The events this process has run through the loops as plain Python (`for_size`)."""


def for_size(loop: F, events: int) -> F:
    """`loop` as Python below COMPILE_FROM_EVENTS events while the events this process has run
    as Python, these included, stay within PYTHON_EVENTS; compiled otherwise, and at any size
    once numba is loaded here (a large run's workers reduce many small files: a 16,384-rank
    run's files of a few thousand records each ran as Python, 28 ms a file)."""
    global _python_events
    if _loaded or events >= COMPILE_FROM_EVENTS or _python_events + events > PYTHON_EVENTS:
        return compiled(loop)
    _python_events += events
    return loop


def is_loaded(loop: Callable[..., Any]) -> bool:
    """Whether `loop` is compiled (or loaded from the cache) in this process already."""
    return loop in _loaded


@cache
def compiled(loop: F) -> F:
    """`loop` compiled by numba (imported here, only when a large timeline needs it), cached in
    `use_user_cache_folder()`'s folder when it named one (also when numba was imported before
    this module set the variable)."""
    import numba
    from numba.core import config

    if os.environ.get(CACHE_ENV) and not getattr(config, "CACHE_DIR", None):
        config.CACHE_DIR = os.environ[CACHE_ENV]  # type: ignore[attr-defined]
    _loaded.add(loop)
    return cast(F, numba.njit(cache=True)(loop))
