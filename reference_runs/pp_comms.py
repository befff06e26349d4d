"""Point-to-point communication between pipeline stages, each message recorded (picotron's
`pp_communications.py`, arXiv 2104.04473 §2.2 for the interleaved neighbours).

Sends are asynchronous (`dist.isend`), receives block right before the compute that needs them.
A rank therefore waits only for data it cannot run without, so any order that respects the
forward/backward dependencies runs without deadlock, even where two neighbours send to each
other at once (1F1B's steady state) with gloo's rendezvous-style send. Every message carries a
tag naming its destination (model stage, micro-batch, direction), so receives match their sends
even when one pair of ranks carries both activations and gradients (interleaved, p = 2).

Recording: a receive is a blocking `recv` (the wait for a late neighbour is pipeline bubble, so it
stays outside the compute spans); a send is an async `send` timed from launch to completion,
which a helper thread per destination observes (gloo's p2p works have no futures).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from collectors.comm import CommEvent

ACT, GRAD = 0, 1  # direction: activation forward, gradient backward


class PipeComms:
    """The sends and receives of one pipeline rank (stage `stage` of `stages`)."""

    def __init__(
        self,
        rec: Any,
        group: Any,
        pp_ranks: list[int],
        stage: int,
        microbatches: int,
        shape: tuple[int, ...],
        expected_bytes: int,
        delay_s: float = 0.0,
        device: torch.device | None = None,
    ) -> None:
        self.rec = rec
        self.group = group
        self.stages = len(pp_ranks)
        self.stage = stage
        self.prev_rank = pp_ranks[(stage - 1) % self.stages]  # wraps around for interleaving
        self.next_rank = pp_ranks[(stage + 1) % self.stages]
        self.microbatches = microbatches
        self.shape = shape
        self.dtype = torch.float32
        self.nbytes = int(torch.Size(shape).numel()) * 4
        self.expected_bytes = expected_bytes
        self.delay_s = delay_s  # slow-comm on the pp group: each message arrives this much later
        self.device = device or torch.device("cpu")
        self.now: Callable[[], int] = rec.clock.now if rec.enabled else time.monotonic_ns
        self._waiters: dict[int, ThreadPoolExecutor] = {}
        self._pending: list[tuple[CommEvent, torch.Tensor, Future[int]]] = []

    def _tag(self, model_stage: int, mb: int, direction: int) -> int:
        return (model_stage * self.microbatches + mb) * 2 + direction

    # ---------------------------------------------------------------- receives (blocking)
    def _recv(self, src: int, tag: int, kind: str) -> torch.Tensor:
        buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        with self.rec.collective(
            "recv",
            self.nbytes,
            self.group,
            dtype="float32",
            expected_bytes=self.expected_bytes,
            tag=kind,
            peer=src,
        ):
            if self.delay_s:
                time.sleep(self.delay_s)
            dist.recv(buf, src, group=self.group, tag=tag)
        return buf

    def recv_forward(self, model_stage: int, mb: int) -> torch.Tensor:
        """The input activation of `model_stage` for micro-batch `mb` (from the previous rank)."""
        return self._recv(self.prev_rank, self._tag(model_stage, mb, ACT), "act")

    def recv_backward(self, model_stage: int, mb: int) -> torch.Tensor:
        """The gradient of `model_stage`'s output for micro-batch `mb` (from the next rank)."""
        return self._recv(self.next_rank, self._tag(model_stage, mb, GRAD), "grad")

    # ---------------------------------------------------------------- sends (async)
    def _send(self, tensor: torch.Tensor, dst: int, tag: int, kind: str) -> None:
        payload = tensor.detach().contiguous()
        event = CommEvent(
            op="send", group=self.group, bytes=self.nbytes, dtype="float32", t0=self.now(),
            t1=0, is_async=True, blocking=False, expected_bytes=self.expected_bytes, tag=kind,
            peer=dst,
        )  # fmt: skip
        self.rec.comm_issued(event)  # in flight until it completes: a stuck send says so
        work = dist.isend(payload, dst, group=self.group, tag=tag)
        waiter = self._waiters.get(dst)
        if waiter is None:
            waiter = self._waiters[dst] = ThreadPoolExecutor(1, thread_name_prefix=f"pp-send{dst}")
        self._pending.append((event, payload, waiter.submit(self._completed, work)))

    def _completed(self, work: Any) -> int:
        work.wait()
        return self.now()

    def send_forward(self, output: torch.Tensor, model_stage: int, mb: int) -> None:
        """Send `model_stage`'s output for `mb` to the rank holding model stage + 1."""
        self._send(output, self.next_rank, self._tag(model_stage + 1, mb, ACT), "act")

    def send_backward(self, input_grad: torch.Tensor, model_stage: int, mb: int) -> None:
        """Send the gradient of `model_stage`'s input for `mb` to the rank holding stage - 1."""
        self._send(input_grad, self.prev_rank, self._tag(model_stage - 1, mb, GRAD), "grad")

    def wait_sends(self) -> None:
        """Wait until every send has been received and record them (end of the schedule).

        The time spent blocked here is a `comm_wait` span: the rank has nothing left to compute.
        """
        t0 = self.now()
        for event, _payload, done in self._pending:
            event.t1 = done.result()
            self.rec.record_comm_event(event)
        t1 = self.now()
        if self._pending and t1 > t0:
            self.rec.record_span_interval("comm_wait", t0, t1, source="pp_send")
        self._pending.clear()

    def close(self) -> None:
        for waiter in self._waiters.values():
            waiter.shutdown(wait=False, cancel_futures=True)
