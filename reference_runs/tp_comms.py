"""Tensor-parallel communication: Megatron's conjugate `f` and `g`, and their sequence-parallel
counterparts, as autograd Functions; every collective is recorded with its place and payload.

Shoeybi et al., "Megatron-LM" (arXiv 1909.08053), section 3 and Figure 3:
    f  identity forward, all-reduce backward   -- where a block enters its parallel region
    g  all-reduce forward, identity backward   -- where it leaves it (after the row-parallel GEMM)
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198), section 4.2.2, replace them under sequence parallelism by
    g-bar  all-gather along the sequence forward, reduce-scatter backward    (enters)
    its conjugate: reduce-scatter forward, all-gather backward               (leaves)
so the activations between blocks (LayerNorm, dropout, residual) hold 1/tp of the sequence.

Each collective is one `rec.collective(...)` record: group `tp`, tag `tp.<place>.<fwd|bwd>`
(`diag.contract.names.tp_tag`; `attn`, `mlp` inside a layer, `embed`, `head` around the stack), the
layer in a `layer` field, and the ledger's payload `micro_batch x seq x hidden x dtype` as expected
bytes. Injected latency (`slow-comm`) sleeps inside the recorded interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from diag.contract.names import tp_tag

# The *_single names are the newer ones; the *_tensor ones are deprecated but older torch has
# only them.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class TpComm:
    """This rank's tensor-parallel group and how its collectives are recorded."""

    group: Any  # the tp process group (dist.group.WORLD when tp is the whole world)
    size: int  # tp degree
    rank: int  # this rank's index in the tp group
    rec: Any  # Recorder or NullRecorder
    expected_bytes: int  # ledger payload of one collective: micro_batch x seq x hidden x dtype
    delay_s: float = 0.0  # injected latency per collective (slow-comm on group tp)
    seq_dim: int = 1  # activations are (batch, seq, hidden)

    def _record(self, op: str, nbytes: int, tag: str, layer: int | None) -> Any:
        return self.rec.collective(
            op, nbytes, self.group, dtype="float32", expected_bytes=self.expected_bytes,
            tag=tag, layer=layer,
        )  # fmt: skip

    def _delay(self) -> None:
        if self.delay_s > 0:
            time.sleep(self.delay_s)

    def all_reduce(self, x: torch.Tensor, tag: str, layer: int | None) -> torch.Tensor:
        """Sum `x` over the group, in place."""
        with self._record("all_reduce", x.numel() * x.element_size(), tag, layer):
            self._delay()
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, tag: str, layer: int | None) -> torch.Tensor:
        """Concatenate every rank's `x` along the sequence; payload = the gathered output."""
        x = x.transpose(0, self.seq_dim).contiguous()  # gather along dim 0, then put seq back
        out = x.new_empty((self.size * x.shape[0], *x.shape[1:]))
        with self._record("all_gather", out.numel() * out.element_size(), tag, layer):
            self._delay()
            _all_gather(out, x, group=self.group)
        return out.transpose(0, self.seq_dim).contiguous()

    def reduce_scatter(self, x: torch.Tensor, tag: str, layer: int | None) -> torch.Tensor:
        """Sum over the group, keep this rank's sequence chunk; payload = the input."""
        x = x.transpose(0, self.seq_dim).contiguous()
        out = x.new_empty((x.shape[0] // self.size, *x.shape[1:]))
        with self._record("reduce_scatter", x.numel() * x.element_size(), tag, layer):
            self._delay()
            _reduce_scatter(out, x, group=self.group)
        return out.transpose(0, self.seq_dim).contiguous()

    def all_reduce_grads(self, params: list[torch.nn.Parameter], tag: str) -> None:
        """Sum the gradients of `params` over the group in one flat all-reduce."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        nbytes = flat.numel() * flat.element_size()
        with self.rec.collective(
            "all_reduce", nbytes, self.group, dtype="float32", expected_bytes=nbytes, tag=tag
        ):
            self._delay()
            dist.all_reduce(flat, group=self.group)
        for grad, summed in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            grad.copy_(summed.view_as(grad))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the sequence (no communication)."""
        return x.chunk(self.size, dim=self.seq_dim)[self.rank].contiguous()


# A place is (name, layer): name is attn, mlp, embed or head; layer is None outside the stack.
Place = tuple[str, int | None]


class CopyToParallelRegion(torch.autograd.Function):
    """Megatron's `f` (arXiv 1909.08053, eq. 3): identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TpComm, place: Place) -> torch.Tensor:
        ctx.comm, ctx.place = comm, place
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        name, layer = ctx.place
        grad = ctx.comm.all_reduce(grad.contiguous().clone(), tp_tag(name, "bwd"), layer)
        return grad, None, None


class ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's `g` (arXiv 1909.08053, eq. 4): all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TpComm, place: Place) -> torch.Tensor:
        name, layer = place
        return comm.all_reduce(x.contiguous().clone(), tp_tag(name, "fwd"), layer)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


class GatherFromSequenceParallel(torch.autograd.Function):
    """Korthikanti's `g-bar`: all-gather along the sequence forward, reduce-scatter backward
    (the gathered activations feed a column-parallel GEMM, whose input gradient is partial).
    With `reduce_grad=False` the backward only keeps this rank's chunk: for a replicated
    consumer (the LM head) whose gradient is already the same on every rank."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, comm: TpComm, place: Place, reduce_grad: bool = True
    ) -> torch.Tensor:
        ctx.comm, ctx.place, ctx.reduce_grad = comm, place, reduce_grad
        name, layer = place
        return comm.all_gather(x, tp_tag(name, "fwd"), layer)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        name, layer = ctx.place
        if not ctx.reduce_grad:
            return ctx.comm.split(grad), None, None, None
        return ctx.comm.reduce_scatter(grad, tp_tag(name, "bwd"), layer), None, None, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """The conjugate of `g-bar`: reduce-scatter along the sequence forward, all-gather backward
    (it replaces `g` after a row-parallel GEMM)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TpComm, place: Place) -> torch.Tensor:
        ctx.comm, ctx.place = comm, place
        name, layer = place
        return comm.reduce_scatter(x, tp_tag(name, "fwd"), layer)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        name, layer = ctx.place
        return ctx.comm.all_gather(grad, tp_tag(name, "bwd"), layer), None, None


class ScatterToSequenceParallel(torch.autograd.Function):
    """Enter the sequence-parallel region from a replicated tensor: keep this rank's chunk
    forward (no communication), all-gather the chunks' gradients backward, so the replicated
    producer (the embeddings) gets the whole gradient on every rank."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TpComm, place: Place) -> torch.Tensor:
        ctx.comm, ctx.place = comm, place
        return comm.split(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        name, layer = ctx.place
        return ctx.comm.all_gather(grad, tp_tag(name, "bwd"), layer), None, None


def enter_parallel_region(
    x: torch.Tensor, comm: TpComm | None, place: Place, sequence_parallel: bool
) -> torch.Tensor:
    """Before a column-parallel GEMM: `f`, or the sequence all-gather; nothing without a group."""
    if comm is None:
        return x
    if sequence_parallel:
        return GatherFromSequenceParallel.apply(x, comm, place)
    return CopyToParallelRegion.apply(x, comm, place)


def leave_parallel_region(
    x: torch.Tensor, comm: TpComm | None, place: Place, sequence_parallel: bool
) -> torch.Tensor:
    """After a row-parallel GEMM: `g`, or the sequence reduce-scatter; nothing without a group."""
    if comm is None:
        return x
    if sequence_parallel:
        return ReduceScatterToSequenceParallel.apply(x, comm, place)
    return ReduceFromParallelRegion.apply(x, comm, place)
