"""Collectors must never stop training: an error inside one is logged once and swallowed."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("collectors")
_reported: set[str] = set()

F = TypeVar("F", bound=Callable[..., Any])


def report_once(where: str, err: BaseException) -> None:
    """Log the first error raised at `where`; later ones are counted silently."""
    if where in _reported:
        return
    _reported.add(where)
    log.warning("collector error in %s (reported once, training goes on): %r", where, err)


def guarded(default: Any = None) -> Callable[[F], F]:
    """Decorate a collector method so an exception in it returns `default` instead of raising."""

    def wrap(fn: F) -> F:
        where = fn.__qualname__

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as err:
                report_once(where, err)
                return default

        return inner  # type: ignore[return-value]

    return wrap
