"""Recording collectives: an opt-in tracer of every torch.distributed call, and the DDP hook.

The tracer wraps the public functions of `torch.distributed` (in both the package and
`distributed_c10d`, so `dist.P2POp` checks still pass) for as long as it is installed. Code that
bound a function before installation (`from torch.distributed import all_reduce`) and
functional collectives (`torch.ops._c10d_functional`) are not seen: record those by hand with
`Recorder.collective(...)`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from collectors.pending import PENDING
from collectors.safety import report_once


@dataclass(kw_only=True)
class CommEvent:
    """One collective as the tracer or the DDP hook saw it (times in ns on the run clock);
    built with keywords only (two of its fields are bare booleans)."""

    op: str
    group: Any  # a ProcessGroup, or None for the default group
    bytes: int
    dtype: str | None
    t0: int
    t1: int
    is_async: bool
    blocking: bool
    expected_bytes: int | None = None
    tag: str | None = None
    fields: dict[str, Any] | None = None  # extra record fields, e.g. `layer` of a TP collective
    peer: int | None = None  # the other rank (global) of a send or recv
    seq: int | None = None  # its order among this rank's collectives on its group (the recorder's)


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _sum_nbytes(ts: Iterable[Any] | None) -> int:
    return sum(_nbytes(t) for t in ts or ())


def _dtype(t: Any) -> str | None:
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return str(t.dtype).removeprefix("torch.") if isinstance(t, torch.Tensor) else None


# function name -> (op, payload tensor(s) argument, how to size it). The payload is the
# nccl-tests "size": gathered output for all-gather, input for reduce-scatter and all-to-all.
TRACED_COLLECTIVES: dict[str, tuple[str, str, Callable[[Any], int]]] = {
    "all_reduce": ("all_reduce", "tensor", _nbytes),
    "broadcast": ("broadcast", "tensor", _nbytes),
    "reduce": ("reduce", "tensor", _nbytes),
    "all_gather": ("all_gather", "tensor_list", _sum_nbytes),
    "all_gather_into_tensor": ("all_gather", "output_tensor", _nbytes),
    "all_gather_single": ("all_gather", "output_tensor", _nbytes),  # newer torch; FSDP2 calls it
    "reduce_scatter": ("reduce_scatter", "input_list", _sum_nbytes),
    "reduce_scatter_tensor": ("reduce_scatter", "input", _nbytes),
    "reduce_scatter_single": ("reduce_scatter", "input", _nbytes),  # newer torch; FSDP2 calls it
    "all_to_all_single": ("all_to_all", "input", _nbytes),
    "all_to_all": ("all_to_all", "input_tensor_list", _sum_nbytes),
    "gather": ("gather", "tensor", _nbytes),
    "scatter": ("scatter", "tensor", _nbytes),
    "send": ("send", "tensor", _nbytes),
    "recv": ("recv", "tensor", _nbytes),
    "isend": ("send", "tensor", _nbytes),
    "irecv": ("recv", "tensor", _nbytes),
    "barrier": ("barrier", "group", lambda _: 0),
}
_ALWAYS_ASYNC = {"isend", "irecv"}
_PEER_ARGS = {"send": ("dst", "group_dst"), "isend": ("dst", "group_dst"),
              "recv": ("src", "group_src"), "irecv": ("src", "group_src")}  # fmt: skip
"""The argument naming the other rank of a point-to-point op: global, or within the group."""


def _peer(name: str, bound: dict[str, Any]) -> int | None:
    """The global rank of a send's destination or a recv's source (None: any source)."""
    args = _PEER_ARGS.get(name)
    if args is None:
        return None
    peer, group_peer = bound.get(args[0]), bound.get(args[1])
    if peer is None and group_peer is not None:
        group: Any = bound.get("group") or dist.group.WORLD
        return int(dist.get_global_rank(group, group_peer))
    return None if peer is None else int(peer)


class _Context(threading.local):
    depth = 0  # > 0 while inside a traced or hand-recorded collective: nested calls not traced
    tag: str | None = None
    expected_bytes: int | None = None


context = _Context()


class TracedWork:
    """Wraps an async `Work`: its `wait()` is recorded as time the caller spent blocked."""

    def __init__(self, work: Any, on_wait: Callable[[int, int], None], now: Callable[[], int]):
        self._work = work
        self._on_wait = on_wait
        self._now = now

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        t0 = self._now()
        try:
            result = self._work.wait(*args, **kwargs)
        except Exception as err:
            # the error is the collective's (a peer that never joined, a timeout): say so, or
            # the traceback's last frame, this wrapper, reads as the collector's fault
            err.add_note(
                "diag: raised by the collective's own wait() (e.g. a peer that never "
                "joined it, or died); the collectors' tracer only passes it on"
            )
            raise
        try:
            self._on_wait(t0, self._now())
        except Exception as err:
            report_once("TracedWork.wait", err)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class CollectiveTracer:
    """Patches torch.distributed so every collective the process issues becomes a CommEvent."""

    _installed: CollectiveTracer | None = None

    def __init__(
        self,
        on_event: Callable[[CommEvent], None],
        on_wait: Callable[[int, int], None],
        now: Callable[[], int],
        before_launch: Callable[[Any], None] | None = None,
        on_issue: Callable[[CommEvent], None] | None = None,
    ) -> None:
        self._on_event = on_event
        self._on_issue = on_issue  # told each collective as it is issued (the in-flight state)
        self._on_wait = on_wait
        self._now = now
        self._before_launch = before_launch
        self._originals: dict[str, Callable[..., Any]] = {}

    def install(self) -> None:
        if CollectiveTracer._installed is not None:
            raise RuntimeError("a CollectiveTracer is already installed in this process")
        for name, spec in TRACED_COLLECTIVES.items():
            original = getattr(c10d, name, None)
            if original is None:
                continue
            self._originals[name] = original
            wrapper = self._wrap(name, original, spec)
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapper)
        CollectiveTracer._installed = self

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            wrapper = getattr(c10d, name)
            setattr(c10d, name, original)
            if getattr(dist, name, None) is wrapper:
                setattr(dist, name, original)
        self._originals.clear()
        if CollectiveTracer._installed is self:
            CollectiveTracer._installed = None

    def _wrap(
        self, name: str, original: Callable[..., Any], spec: tuple[str, str, Callable[[Any], int]]
    ) -> Callable[..., Any]:
        op, payload_arg, size = spec
        signature = inspect.signature(original)
        always_async = name in _ALWAYS_ASYNC

        def traced(*args: Any, **kwargs: Any) -> Any:
            if context.depth:
                return original(*args, **kwargs)
            try:
                bound = signature.bind(*args, **kwargs).arguments
                payload = bound.get(payload_arg)
                event = CommEvent(
                    op=op,
                    group=bound.get("group"),
                    bytes=size(payload),
                    dtype=_dtype(payload),
                    t0=0,
                    t1=0,
                    is_async=always_async or bool(bound.get("async_op", False)),
                    blocking=False,
                    expected_bytes=context.expected_bytes,
                    tag=context.tag,
                    peer=_peer(name, bound),
                )
                if self._before_launch is not None:
                    self._before_launch(event)
            except Exception as err:
                report_once(f"trace {name}", err)
                return original(*args, **kwargs)
            context.depth += 1
            try:
                event.t0 = self._now()
                if self._on_issue is not None:
                    self._on_issue(event)  # guarded by the recorder
                result = original(*args, **kwargs)
            finally:
                context.depth -= 1
            return self._finish(event, result)

        traced.__wrapped__ = original  # type: ignore[attr-defined]
        traced.__name__ = name
        traced.__doc__ = original.__doc__
        return traced

    def _finish(self, event: CommEvent, result: Any) -> Any:
        try:
            if not event.is_async or result is None:
                # A blocking call (or one whose work was coalesced away): done when it returns.
                event.t1 = self._now()
                event.blocking = not event.is_async
                self._on_event(event)
                return result
            self._record_on_completion(event, result)
            return TracedWork(result, self._on_wait, self._now)
        except Exception as err:
            report_once("CollectiveTracer._finish", err)
            return result

    def _record_on_completion(self, event: CommEvent, work: Any) -> None:
        def done(fut: Any) -> None:
            event.t1 = self._now()
            self._on_event(event)

        try:
            work.get_future().add_done_callback(PENDING.track(done))
        except (RuntimeError, AttributeError):
            # A backend without futures for this op: the launch is all we can time.
            event.t1 = event.t0
            self._on_event(event)
