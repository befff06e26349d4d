"""A DDP communication hook that records each bucket's all-reduce (bytes, timing, expected).

It does what DDP's default all-reduce does (average the bucket across the group) and records:
- one `comm` record per bucket: payload = the bucket's flat gradient buffer, expected = the
  gradients of the parameters in the bucket (the ledger's payload, params x grad dtype bytes),
  t0 when the bucket was ready and launched, t1 when its all-reduce completed;
- the bucket buffers as communication buffers (memory category);
- per step, a `comm_wait` span from the last bucket's launch (backward compute is done by then)
  to the last completion: the time the rank waits for the slowest rank inside backward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from collectors.comm import CommEvent, context

if TYPE_CHECKING:
    from collectors.recorder import Recorder


class DDPHookState:
    def __init__(
        self,
        recorder: Recorder,
        process_group: Any,
        before_launch: Callable[[], None] | None,
        tag: str,
    ) -> None:
        self.recorder = recorder
        self.process_group = process_group
        self.before_launch = before_launch
        self.tag = tag
        self._lock = threading.Lock()
        self._last_launch_ns: int | None = None
        self._last_done_ns: int | None = None
        self._original_all_reduce = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
        self.group_size = dist.get_world_size(process_group)
        # bucket index -> (buffer bytes, expected bytes); DDP rebuilds its buckets once, after
        # the first step, so an entry is recomputed when its buffer size changes.
        self._buckets: dict[int, tuple[int, int]] = {}

    def expected_bytes(self, bucket: Any, buffer_bytes: int) -> int:
        """The gradient payload of the bucket's parameters; declares the bucket a comm buffer."""
        index = bucket.index()
        known = self._buckets.get(index)
        if known is None or known[0] != buffer_bytes:
            element_bytes = bucket.buffer().element_size()
            expected = sum(p.numel() * element_bytes for p in bucket.parameters())
            known = self._buckets[index] = (buffer_bytes, expected)
            self.recorder.set_comm_buffer(f"ddp_bucket_{index}", buffer_bytes)
        return known[1]

    def launched(self, t0: int) -> None:
        with self._lock:
            self._last_launch_ns = max(t0, self._last_launch_ns or t0)

    def completed(self, t1: int) -> None:
        with self._lock:
            self._last_done_ns = max(t1, self._last_done_ns or t1)

    def take_wait_interval(self) -> tuple[int, int] | None:
        """The (last launch, last completion) since the previous call, if a sync happened."""
        with self._lock:
            launch, done = self._last_launch_ns, self._last_done_ns
            self._last_launch_ns = self._last_done_ns = None
        if launch is None or done is None or done <= launch:
            return None
        return launch, done


def recording_allreduce_hook(state: DDPHookState, bucket: Any) -> torch.futures.Future:
    rec = state.recorder
    group = state.process_group
    buffer: torch.Tensor = bucket.buffer()
    nbytes = buffer.numel() * buffer.element_size()
    expected = state.expected_bytes(bucket, nbytes)
    t0 = rec.clock.now()
    if state.before_launch is not None:
        state.before_launch()  # injected latency belongs to the collective: after t0
    buffer.div_(state.group_size)
    event = CommEvent(
        op="all_reduce",
        group=group,
        bytes=nbytes,
        dtype=str(buffer.dtype).removeprefix("torch."),
        t0=t0,
        t1=0,
        is_async=True,
        blocking=False,
        expected_bytes=expected,
        tag=state.tag,
    )
    state.launched(event.t0)
    context.depth += 1  # the tracer, if installed, must not record this call a second time
    try:
        work = state._original_all_reduce(buffer, group=group, async_op=True)
    finally:
        context.depth -= 1

    def done(fut: torch.futures.Future) -> torch.Tensor:
        event.t1 = rec.clock.now()
        state.completed(event.t1)
        rec.record_comm_event(event)
        return fut.value()[0]

    return work.get_future().then(done)


# DDP inspects the hook's annotations, which `from __future__ import annotations` turns into
# strings; give it the real classes it compares against.
recording_allreduce_hook.__annotations__.update(
    bucket=dist.GradBucket, state=DDPHookState, **{"return": torch.futures.Future[torch.Tensor]}
)


def register_recording_hook(
    recorder: Recorder,
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    process_group: Any = None,
    before_launch: Callable[[], None] | None = None,
    tag: str = "grad",
) -> DDPHookState:
    """Register the recording all-reduce hook on a DDP model; returns its state.

    `before_launch` runs before each bucket's all-reduce (fault injection uses it to add
    latency). The recorder closes each step's wait interval through the returned state.
    """
    state = DDPHookState(recorder, process_group, before_launch, tag)
    ddp_model.register_comm_hook(state, recording_allreduce_hook)
    recorder.on_step_end(lambda: _emit_wait(recorder, state))
    return state


def _emit_wait(recorder: Recorder, state: DDPHookState) -> None:
    interval = state.take_wait_interval()
    if interval is not None:
        recorder.record_span_interval("comm_wait", interval[0], interval[1], source="ddp_hook")
