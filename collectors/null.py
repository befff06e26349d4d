"""The recorder that records nothing and costs nothing (collectors switched off)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

Batch = TypeVar("Batch")


class NullContext:
    loss: Any = None

    def __enter__(self) -> NullContext:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


NULL_CONTEXT = NullContext()


class NullRecorder:
    """A recorder that records nothing and costs nothing (collectors switched off)."""

    enabled = False
    rank = 0
    step_index = 0
    phase: str | None = None

    def step(self, tokens: int | None = None) -> NullContext:
        return NULL_CONTEXT

    def span(self, phase: str, mb: Any = None, stage: Any = None, chunk: Any = None) -> NullContext:
        return NULL_CONTEXT

    def iterate(self, loader: Iterable[Batch]) -> Iterator[Batch]:
        return iter(loader)

    def collective(self, *args: Any, **kwargs: Any) -> NullContext:
        return NULL_CONTEXT

    def tagged(self, *args: Any, **kwargs: Any) -> NullContext:
        return NULL_CONTEXT

    def __getattr__(self, name: str) -> Callable[..., None]:
        return _noop

    def __enter__(self) -> NullRecorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _noop(*args: Any, **kwargs: Any) -> None:
    return None
