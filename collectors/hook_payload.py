"""What a user's DDP communication hook really sends: the bytes of the collectives it issues.

A compression hook (`fp16_compress_hook`, `bf16_compress_hook`, PowerSGD) sends less than the
bucket it is given, and PowerSGD issues its second all-reduce from a future's callback, on
whichever thread completes the first one. So the payload cannot be read from the bucket, nor
caught by a thread-local scope around the hook call: while a bucket is in flight (from the
hook's call to its future's completion), `PayloadCapture` counts every collective issued
through `torch.distributed` in the process. DDP runs nothing else then, so per step the sum is
the hook's payload exactly; per bucket it is what was issued since the previous bucket
completed (PowerSGD may start a bucket's first all-reduce before the previous one finishes).
"""

from __future__ import annotations

import inspect
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from collectors.comm import TRACED_COLLECTIVES, context
from collectors.safety import report_once

# The collectives a gradient hook may issue (the rest of TRACED_COLLECTIVES: pipelines, MoE,
# barriers).
_HOOK_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
)  # fmt: skip


class PayloadCapture:
    """Counts the bytes issued while buckets are in flight; install once per process."""

    _installed: PayloadCapture | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._bytes = 0
        self._ops: Counter[str] = Counter()
        self._dtypes: Counter[str] = Counter()
        self._originals: dict[str, tuple[Callable[..., Any], Any]] = {}  # dist's, c10d's

    @classmethod
    def install(cls) -> PayloadCapture | None:
        """The process's capture, patched into torch.distributed; None if one already runs."""
        if cls._installed is not None:
            return None
        capture = cls()
        for name in _HOOK_COLLECTIVES:
            current = getattr(dist, name, None)
            if current is None:
                continue
            capture._originals[name] = (current, getattr(c10d, name, None))
            wrapper = capture._wrap(name, current)
            setattr(dist, name, wrapper)
            setattr(c10d, name, wrapper)
        cls._installed = capture
        return capture

    def uninstall(self) -> None:
        for name, (in_dist, in_c10d) in self._originals.items():
            setattr(dist, name, in_dist)
            if in_c10d is not None:
                setattr(c10d, name, in_c10d)
        self._originals.clear()
        if PayloadCapture._installed is self:
            PayloadCapture._installed = None

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end(self) -> tuple[int, str, str | None]:
        """A bucket completed: (bytes issued since the last completion, op, dtype)."""
        with self._lock:
            self._in_flight = max(self._in_flight - 1, 0)
            nbytes, ops, dtypes = self._bytes, self._ops, self._dtypes
            self._bytes, self._ops, self._dtypes = 0, Counter(), Counter()
        op = ops.most_common(1)[0][0] if ops else "all_reduce"
        dtype = dtypes.most_common(1)[0][0] if dtypes else None
        return nbytes, op, dtype

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        op, payload_arg, size = TRACED_COLLECTIVES[name]
        signature = inspect.signature(getattr(original, "__wrapped__", original))

        def captured(*args: Any, **kwargs: Any) -> Any:
            if not self._in_flight:
                return original(*args, **kwargs)
            try:
                payload = signature.bind(*args, **kwargs).arguments.get(payload_arg)
                first = payload[0] if isinstance(payload, list | tuple) and payload else payload
                with self._lock:
                    self._bytes += size(payload)
                    self._ops[op] += 1
                    if first is not None and hasattr(first, "dtype"):
                        self._dtypes[str(first.dtype).removeprefix("torch.")] += 1
            except Exception as err:
                report_once(f"hook payload {name}", err)
            context.depth += 1  # the collective tracer, if installed, must not count it again
            try:
                return original(*args, **kwargs)
            finally:
                context.depth -= 1

        captured.__wrapped__ = original  # type: ignore[attr-defined]
        captured.__name__ = name
        captured.__doc__ = original.__doc__
        return captured
