"""Expert-parallel communication: the split-size exchange, the dispatch and combine all-to-alls
(autograd through both), and the gradient all-reduces; every one recorded with its payload.

Lepikhin et al., "GShard" (arXiv 2006.16668), section 3.2: each MoE layer moves its tokens to the
experts' ranks with one all-to-all (dispatch) and brings the expert outputs back with a second
(combine). The seed's ledger expects `tokens x topk x hidden x dtype` bytes per direction
(`diag.contract.ledger.ep_alltoall_bytes`), where `tokens` are this rank's tokens of one
micro-batch.

Records (group `ep` unless said otherwise), each `bytes` the payload actually sent (the sum of
the input splits), so padding or duplication would show as a ratio above 1 and dropped tokens
as a ratio below 1:
    splits         all_to_all of the per-expert token counts (int64), before each dispatch
    dispatch       all_to_all of the tokens to their experts' ranks          (forward)
    combine        all_to_all of the expert outputs back to the tokens' ranks (forward)
    dispatch.bwd   the dispatch's backward: token gradients back to their ranks
    combine.bwd    the combine's backward: output gradients to the experts' ranks
    grad           gradient all-reduce (group `ep`, `dp` or `world`), after the last backward
    expert_stats   all-reduce of the per-layer routing counts (only with collectors on)
Injected latency (`slow-comm`) sleeps inside the recorded interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from diag.contract.names import backward_tag

DTYPE_NAMES = {torch.float32: "float32", torch.int64: "int64", torch.float64: "float64"}


@dataclass
class EpComm:
    """This rank's expert-parallel group and how its collectives are recorded."""

    group: Any  # the ep process group (dist.group.WORLD when ep is the whole world)
    size: int  # ep degree
    rank: int  # this rank's index in the ep group
    rec: Any  # Recorder or NullRecorder
    expected_bytes: int  # ledger bytes of one dispatch (or combine): tokens x topk x hidden x 4
    delay_s: float = 0.0  # injected latency per collective (slow-comm on group ep)

    def _delay(self) -> None:
        if self.delay_s > 0:
            time.sleep(self.delay_s)

    def exchange_counts(self, send_counts: torch.Tensor, layer: int) -> torch.Tensor:
        """(E,) tokens this rank sends to each expert -> (ep, E/ep) tokens each source rank
        sends to each of this rank's experts. Equal splits: every rank sends E/ep counts."""
        counts = send_counts.to(torch.int64).contiguous()
        out = torch.empty_like(counts)
        nbytes = counts.numel() * counts.element_size()
        with self.rec.collective(
            "all_to_all", nbytes, self.group, dtype="int64", expected_bytes=nbytes,
            tag="splits", layer=layer,
        ):  # fmt: skip
            self._delay()
            dist.all_to_all_single(out, counts, group=self.group)
        return out.view(self.size, -1)

    def all_to_all(
        self, x: torch.Tensor, out_splits: list[int], in_splits: list[int], tag: str, layer: int
    ) -> torch.Tensor:
        """Rows `in_splits[r]` of `x` go to rank r; rows `out_splits[r]` come from rank r."""
        x = x.contiguous()
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        with self.rec.collective(
            "all_to_all", x.numel() * x.element_size(), self.group,
            dtype=DTYPE_NAMES.get(x.dtype, str(x.dtype)), expected_bytes=self.expected_bytes,
            tag=tag, layer=layer,
        ):  # fmt: skip
            self._delay()
            dist.all_to_all_single(out, x, out_splits, in_splits, group=self.group)
        return out


class AllToAll(torch.autograd.Function):
    """An all-to-all on uneven splits forward; the reverse all-to-all backward (the splits
    swapped), recorded under `<tag>.bwd`."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, comm: EpComm, out_splits: list[int], in_splits: list[int],
        tag: str, layer: int,
    ) -> torch.Tensor:  # fmt: skip
        ctx.comm, ctx.splits, ctx.tag, ctx.layer = comm, (out_splits, in_splits), tag, layer
        return comm.all_to_all(x, out_splits, in_splits, tag, layer)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out_splits, in_splits = ctx.splits
        back = ctx.comm.all_to_all(grad, in_splits, out_splits, backward_tag(ctx.tag), ctx.layer)
        return back, None, None, None, None, None


def all_reduce_(
    tensors: list[torch.Tensor], group: Any, rec: Any, tag: str, delay_s: float = 0.0
) -> None:
    """Sum `tensors` (one dtype) over `group` in one flat all-reduce, in place; payload = the
    flat tensor, which is also what theory expects."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    nbytes = flat.numel() * flat.element_size()
    dtype = DTYPE_NAMES.get(flat.dtype, str(flat.dtype))
    with rec.collective("all_reduce", nbytes, group, dtype=dtype, expected_bytes=nbytes, tag=tag):
        if delay_s > 0:
            time.sleep(delay_s)
        dist.all_reduce(flat, group=group)
    for t, summed in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
        t.copy_(summed.view_as(t))
