"""The pages, in one registry: `PAGES` is the navigation's order, the router's table and the
list of callbacks to register (dashboard/app.py reads nothing else).

A page is a module of this package with `PATH`, `TITLE` and `layout(loaded, runs)`; a page with
interactions also has `register(app, runs)` for its callbacks. A new page is a module here and
one entry in `PAGES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dash import Dash

from dashboard.data import LoadedRun
from dashboard.pages import communication, compare, experts, memory, overview, ranks, timeline


class Page(Protocol):
    """What the shell reads of a page module."""

    PATH: str
    TITLE: str

    def layout(self, loaded: LoadedRun, runs: Sequence[LoadedRun]) -> Any: ...


PAGES: tuple[Page, ...] = (overview, timeline, ranks, communication, memory, experts, compare)
"""Every page, in the order of the navigation; the first is the home page."""


def callbacks(page: Page) -> Callable[[Dash, Sequence[LoadedRun]], None] | None:
    """The page's `register(app, runs)`, or None for a page without interactions."""
    register: Callable[[Dash, Sequence[LoadedRun]], None] | None = getattr(page, "register", None)
    return register
