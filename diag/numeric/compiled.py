"""Loops compiled with numba where the input is large enough to need it.

The loops (the what-if replay and its scan of waits, the time breakdown's interval unions) are
written once, as plain Python over numpy arrays that numba compiles unchanged. Small inputs
(the tests, a few ranks) run them as Python: importing numba and loading its compiled code
costs about a second, more than such a loop takes. Compiled code is cached by numba beside
this package (`__pycache__`), written by this user's own runs only; nothing of a run
directory is compiled or loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

COMPILE_FROM_EVENTS = 5_000
"""Timelines of at least this many events run the compiled loops (plain Python takes ~15 us an
event, a replay of 5,000 events ~0.1 s, about what importing numba costs; compiled ~0.1 us)."""


_loaded: set[Callable[..., Any]] = set()
"""The loops compiled (or loaded) in this process (a loader prepares them before forking its
workers, which inherit them)."""


def for_size(loop: F, events: int) -> F:
    """`loop` as Python below COMPILE_FROM_EVENTS events, compiled from there on, and at any
    size once it is loaded (a large run's workers reduce many small files: a 16,384-rank run's
    files of a few thousand records each ran as Python, 28 ms a file)."""
    return compiled(loop) if events >= COMPILE_FROM_EVENTS or loop in _loaded else loop


@cache
def compiled(loop: F) -> F:
    """`loop` compiled by numba (imported here, only when a large timeline needs it)."""
    import numba

    _loaded.add(loop)
    return cast(F, numba.njit(cache=True)(loop))
