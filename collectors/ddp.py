"""A DDP communication hook that records each bucket's all-reduce (bytes, timing, expected).

It does what DDP's default all-reduce does (average the bucket across the group), or runs the
user's own hook (PowerSGD, `fp16_compress_hook`, `bf16_compress_hook`: `hook=`) and records
what that hook really sends (collectors/hook_payload.py), and records:
- one `comm` record per bucket: payload = the bucket's flat gradient buffer, expected = the
  gradients of the parameters in the bucket (the ledger's payload, params x grad dtype bytes),
  t0 when the bucket was ready and launched, t1 when its all-reduce completed;
- the bucket buffers as communication buffers (memory category);
- per step, a `comm_wait` span from the last bucket's launch (backward compute is done by then)
  to the last completion: the time the rank waits for the slowest rank inside backward.

Registering it declares DDP's process group the `dp` group (the layout's dp is its size unless
the user gave one), and `checksum_every=N` all-gathers a checksum of the parameters every N
steps (`param_checksum` events): ranks whose weights drift apart are not synchronised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from collectors.comm import CommEvent, context
from collectors.hook_payload import PayloadCapture
from collectors.manifest import DataParallel
from collectors.pending import PENDING
from collectors.safety import report_once

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
        # the user's hook and its state, run in place of the plain all-reduce
        self.user_hook: Callable[[Any, Any], torch.futures.Future[Any]] | None = None
        self.user_state: Any = None
        self.capture: PayloadCapture | None = None
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
    rec.comm_issued(event)  # in flight until done: a rank stuck in it says so (guarded)
    context.depth += 1  # the tracer, if installed, must not record this call a second time
    try:
        work = state._original_all_reduce(buffer, group=group, async_op=True)
    finally:
        context.depth -= 1

    def done(fut: torch.futures.Future) -> torch.Tensor:
        try:
            value = fut.value()[0]
        except Exception as err:
            raise RuntimeError(_failed_collective(rec, event, err)) from None
        event.t1 = rec.clock.now()
        state.completed(event.t1)
        rec.record_comm_event(event)
        return value

    return work.get_future().then(PENDING.track(done))


def _failed_collective(rec: Recorder, event: CommEvent, err: BaseException) -> str:
    """The error of a bucket's all-reduce that did not complete, naming the collective: DDP
    raises it from backward with this callback's frame last, which alone would make the
    collectors look guilty. The collective stays in the rank's in-flight state (comm_issued)."""
    return (f"{err}\n[diag] DDP's gradient all-reduce did not complete: {event.op} #{event.seq} "
            f"of group {rec.group_name(event.group)!r} ({event.bytes} bytes, step "
            f"{rec.step_index}). The error is the collective's (a peer that never joined it, "
            "or died); the collectors' DDP hook only passes it on.")  # fmt: skip


def recording_wrapper_hook(state: DDPHookState, bucket: Any) -> torch.futures.Future:
    """The user's hook, timed, its real payload recorded against the bucket's gradients."""
    rec, capture, hook = state.recorder, state.capture, state.user_hook
    assert hook is not None and capture is not None
    buffer: torch.Tensor = bucket.buffer()
    nbytes = buffer.numel() * buffer.element_size()
    expected = state.expected_bytes(bucket, nbytes)
    t0 = rec.clock.now()
    if state.before_launch is not None:
        state.before_launch()
    state.launched(t0)
    capture.begin()
    try:
        future = hook(state.user_state, bucket)
    except BaseException:
        capture.end()
        raise

    def done(fut: torch.futures.Future) -> Any:
        try:
            t1 = rec.clock.now()
            sent_bytes, op, dtype = capture.end()
            state.completed(t1)
            event = CommEvent(
                op=op, group=state.process_group, bytes=sent_bytes, dtype=dtype, t0=t0, t1=t1,
                is_async=True, blocking=False, expected_bytes=expected, tag=state.tag,
                fields={"hook": _hook_name(hook), "uncompressed_bytes": nbytes},
            )  # fmt: skip
            rec.record_comm_event(event)
        except Exception as err:
            report_once("recording_wrapper_hook", err)
        return fut.value()  # the user's result, untouched (an error in it propagates)

    return future.then(PENDING.track(done))


# DDP inspects the hook's annotations, which `from __future__ import annotations` turns into
# strings; give it the real classes it compares against.
for _hook in (recording_allreduce_hook, recording_wrapper_hook):
    _hook.__annotations__.update(
        bucket=dist.GradBucket, state=DDPHookState, **{"return": torch.futures.Future[torch.Tensor]}
    )


def _hook_name(hook: Callable[..., Any]) -> str:
    return str(getattr(hook, "__qualname__", None) or type(hook).__name__)


def register_recording_hook(
    recorder: Recorder,
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    process_group: Any = None,
    before_launch: Callable[[], None] | None = None,
    tag: str = "grad",
    *,
    hook: Callable[[Any, Any], torch.futures.Future[Any]] | None = None,
    hook_state: Any = None,
    checksum_every: int = 0,
) -> DDPHookState | None:
    """Register the recording hook on a DDP model; returns its state (None when off).

    `hook`/`hook_state` are the communication hook you would give `register_comm_hook`
    (e.g. `bf16_compress_hook` and a process group, or `powerSGD_hook` and its
    `PowerSGDState`): it runs as it would, and its real payload is recorded against the
    uncompressed gradients. DDP accepts one hook per model, so register yours through here.
    `process_group` defaults to DDP's (`ddp_model.process_group`); it becomes the `dp` group.
    `before_launch` runs before each bucket's all-reduce (fault injection uses it to add
    latency). `checksum_every=N` (0: off) all-gathers a parameter checksum every N steps.
    """
    if not getattr(recorder, "enabled", False):
        if hook is not None:  # collectors off: the job still trains with its own hook
            ddp_model.register_comm_hook(hook_state, hook)
        return None
    group = process_group
    for candidate in (getattr(ddp_model, "process_group", None), dist.group.WORLD):
        group = candidate if group is None else group
    state = DDPHookState(recorder, group, before_launch, tag)
    hooked = bool(getattr(ddp_model, "_comm_hooks", None))  # DDP takes one hook per model
    if hook is not None and not hooked:
        state.capture = PayloadCapture.install()  # None: a second model's, run unrecorded
    recorded = not hooked and (hook is None or state.capture is not None)
    # an unrecorded sync declares no tag: the no-sync rule must not read its silence
    recorder.declare_data_parallel(
        DataParallel(wrapper="ddp", group=group, size=state.group_size,
                     tag=tag if recorded else None, hook=_hook_name(hook) if hook else None)
    )  # fmt: skip
    if not recorded:
        why = "the model already has a comm hook" if hooked else "one recorded hook a process"
        recorder.event("grad_sync_unrecorded", reason=why)
        report_once(
            "register_recording_hook",
            RuntimeError(f"DDP gradients not recorded: {why}; pass your hook as "
                         "register_recording_hook(rec, model, hook=..., hook_state=...)"),
        )  # fmt: skip
        if not hooked and hook is not None:
            ddp_model.register_comm_hook(hook_state, hook)
        return None
    recording = recording_allreduce_hook
    if state.capture is not None:
        state.user_hook, state.user_state = hook, hook_state
        recording = recording_wrapper_hook
        recorder.on_close(state.capture.uninstall)
    ddp_model.register_comm_hook(state, recording)
    recorder.on_step_end(lambda: _emit_wait(recorder, state))
    _record_buffer_broadcasts(recorder, ddp_model, group)
    _record_bucket_rebuild(recorder, ddp_model, group)
    if checksum_every > 0 and state.group_size > 1:
        module = getattr(ddp_model, "module", ddp_model)
        recorder.on_step_end(lambda: _checksum(recorder, module, group, checksum_every))
    return state


def _record_buffer_broadcasts(recorder: Recorder, ddp_model: Any, group: Any) -> None:
    """DDP broadcasts rank 0's buffers (BatchNorm statistics, any registered buffer) at every
    forward, inside C++ where the tracer cannot see it: a rank waits there for its slowest peer,
    which must read as waiting, not as forward compute. Recorded as a blocking `broadcast`,
    tag `ddp.buffers`, by wrapping this model's (private, long-stable) broadcast method."""
    original = getattr(ddp_model, "_distributed_broadcast_coalesced", None)
    if original is None or not getattr(ddp_model, "modules_buffers", None):
        return

    def broadcast(bufs: Any, bucket_size: int, authoritative_rank: int = 0) -> Any:
        tensors = list(bufs)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else None
        with recorder.collective("broadcast", nbytes, group, dtype=dtype, tag="ddp.buffers"):
            return original(tensors, bucket_size, authoritative_rank)

    ddp_model._distributed_broadcast_coalesced = broadcast


def _record_bucket_rebuild(recorder: Recorder, ddp_model: Any, group: Any) -> None:
    """DDP rebuilds its buckets once, at the start of its second forward with gradients on:
    rank 0 broadcasts the buckets' new order of the parameters, inside C++ where the tracer
    cannot see it, and a rank waits there for its slowest peer (beside a 50 ms straggler, the
    other rank's forward of step 1 took 68 ms, against 6 ms in later steps, all of it counted
    as compute). A forward pre-hook makes that call itself, as DDP's forward would, and records
    it as a blocking `broadcast`, tag `ddp.buckets`; DDP's own call then finds it done. The
    payload recorded: an int32 index per parameter (the order; the bucket sizes beside it are
    left out). The hook holds no reference to the model (`module` is it): a cycle would keep
    a finished model alive until the process group is gone, and its reducer's destructor then
    aborts the process at exit."""
    rebuild = getattr(getattr(ddp_model, "reducer", None), "_rebuild_buckets", None)
    if rebuild is None or dist.get_world_size(group) < 2:  # alone: no peer to wait for
        return
    nbytes = 4 * sum(1 for _ in ddp_model.parameters())
    handle: Any = None

    def before_forward(module: Any, args: Any) -> None:
        if not torch.is_grad_enabled():  # DDP rebuilds only then, too
            return
        t0 = recorder.clock.now()
        if not rebuild():  # nothing to rebuild yet (the first forward), or never (static graph)
            return
        t1 = recorder.clock.now()
        handle.remove()
        module._has_rebuilt_buckets = True  # as DDP's forward marks it
        event = CommEvent(
            op="broadcast", group=group, bytes=nbytes, dtype="int32", t0=t0, t1=t1,
            is_async=False, blocking=True, tag="ddp.buckets",
        )  # fmt: skip
        recorder.record_comm_event(event)  # guarded: a recording failure never stops training

    handle = ddp_model.register_forward_pre_hook(before_forward)


def parameter_checksum(module: torch.nn.Module) -> float:
    """A cheap fingerprint of the weights: the float64 sum of every parameter's sum."""
    with torch.no_grad():
        return float(sum(float(p.detach().double().sum()) for p in module.parameters()))


def _checksum(recorder: Recorder, module: torch.nn.Module, group: Any, every: int) -> None:
    """Every `every` steps, all ranks' checksums, as a `param_checksum` event (not traced)."""
    if recorder.step_index % every:
        return
    mine = torch.tensor([parameter_checksum(module)], dtype=torch.float64)
    gathered = torch.empty(dist.get_world_size(group), dtype=torch.float64)
    context.depth += 1  # the recorder's own collective is not the job's: not traced
    try:
        dist.all_gather_into_tensor(gathered, mine, group=group)
    finally:
        context.depth -= 1
    recorder.event("param_checksum", group="dp", values=[float(v) for v in gathered.tolist()])


def _emit_wait(recorder: Recorder, state: DDPHookState) -> None:
    interval = state.take_wait_interval()
    if interval is not None:
        recorder.record_span_interval("comm_wait", interval[0], interval[1], source="ddp_hook")
