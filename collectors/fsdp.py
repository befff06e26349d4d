"""Recording FSDP2 (`fully_shard`, ZeRO-3): per-unit all-gathers and reduce-scatters, and the
unsharded parameters as communication buffers.

FSDP2 issues its collectives through `dist.all_gather_single` and `dist.reduce_scatter_single`,
looked up at call time (torch 2.13), so the collective tracer would see them; but it could not
tell which unit (layer) a collective belongs to, nor whether an all-gather serves forward or
backward (backward prefetches the previous layer's). So `register_fsdp_recording` gives every
FSDP unit its own communication objects through FSDP2's public hooks
`FSDPModule.set_custom_all_gather` / `set_custom_reduce_scatter`. They call the same functions
FSDP2's defaults call, inside `Recorder.collective(...)` (the tracer, if installed, does not
count them again), and record for each unit (FSDP2 calls them synchronously by default, on its
own streams on GPU, so the recorded interval is the call):

- `all_gather`, tag `fsdp.ag.fwd` or `fsdp.ag.bwd` (the phase of the span it runs in): payload
  the gathered flat buffer, expected the unit's unsharded parameters (numel x element size);
- `reduce_scatter`, tag `fsdp.rs`: payload the flat unsharded gradients, expected the unit's
  unsharded gradients. A payload above the expectation is the padding of uneven shards (FSDP2
  pads each parameter's dim 0 to a multiple of the group size).

Memory: the unsharded parameters FSDP2 materialises, and the flat buffers it gathers into and
reduce-scatters from, are communication buffers. An unsharded parameter's storage is filled at
each all-gather and emptied in place at reshard; at every flat-buffer allocation (where this
memory grows) the meter adds the new buffer to the unsharded parameter storages alive then, and
the step's peak is declared as the comm buffer `fsdp_unsharded`. Not in that number: flat
buffers FSDP2 keeps a little longer (in forward it frees a unit's gathered buffer at the next
unit's copy-out, for overlap; a reduce-scatter input until the next reduce-scatter), since a
backend may also hold a finished buffer for a moment and counting it would make the number
depend on thread timing. The saved-tensor tracker skips parameters and their views, so an
unsharded weight saved for backward is counted once, here, not again as an activation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.tensor import DTensor

from collectors.manifest import DataParallel
from collectors.safety import report_once

if TYPE_CHECKING:
    from collectors.null import NullRecorder
    from collectors.recorder import Recorder

COMM_BUFFER_NAME = "fsdp_unsharded"


def managed_parameters(unit: nn.Module) -> list[tuple[nn.Module, str]]:
    """(module, attribute) of every parameter `unit` shards itself: its own and its
    submodules', except those of nested FSDP units. A shared (tied) parameter appears once."""
    found: list[tuple[nn.Module, str]] = []
    seen: set[int] = set()

    def visit(module: nn.Module) -> None:
        for name, param in module.named_parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                found.append((module, name))
        for child in module.children():
            if not isinstance(child, FSDPModule):
                visit(child)

    visit(unit)
    return found


def unsharded_numel(unit: nn.Module) -> int:
    """Elements of the unit's parameters once gathered (a DTensor's numel is the global one)."""
    return sum(getattr(m, name).numel() for m, name in managed_parameters(unit))


class UnshardedMeter:
    """The step's peak of unsharded parameter bytes plus the flat buffer being allocated."""

    def __init__(self, rec: Recorder | NullRecorder, units: Sequence[nn.Module]) -> None:
        self.rec = rec
        self._slots = [slot for unit in units for slot in managed_parameters(unit)]
        self.peak_bytes = 0

    def live_bytes(self) -> int:
        """Bytes in the storages of the parameters that are unsharded now (each storage once)."""
        seen: set[int] = set()
        total = 0
        for module, name in self._slots:
            param = getattr(module, name)
            if isinstance(param, DTensor):  # sharded: the unit's shard, counted as params
                continue
            storage = param.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and ptr not in seen:
                seen.add(ptr)
                total += storage.nbytes()
        return total

    def allocated(self, buffer: torch.Tensor) -> None:
        """A new flat buffer joins the unsharded parameters (memory grows here: a peak)."""
        try:
            self.peak_bytes = max(self.peak_bytes, self.live_bytes() + _nbytes(buffer))
        except Exception as err:
            report_once("UnshardedMeter.allocated", err)

    def step_end(self) -> None:
        self.rec.set_comm_buffer(COMM_BUFFER_NAME, self.peak_bytes)
        self.peak_bytes = 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _UnitComm:
    """What the all-gather and reduce-scatter of one unit share."""

    def __init__(
        self,
        rec: Recorder | NullRecorder,
        meter: UnshardedMeter,
        numel: int,
        layer: int | None,
        delay_s: float,
    ) -> None:
        self.rec, self.meter, self.numel = rec, meter, numel
        self.layer, self.delay_s = layer, delay_s

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        buffer = torch.empty(*size, dtype=dtype, device=device)  # what FSDP2's default does
        self.meter.allocated(buffer)
        return buffer

    def _record(self, op: str, payload: torch.Tensor, group: Any, tag: str) -> Any:
        try:
            return self.rec.collective(
                op,
                _nbytes(payload),
                group,
                dtype=str(payload.dtype).removeprefix("torch."),
                expected_bytes=self.numel * payload.element_size(),
                tag=tag,
                layer=self.layer,
            )
        except Exception as err:  # never stop the collective itself
            report_once(f"fsdp {op} record", err)
            return contextlib.nullcontext()

    def _delay(self) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)  # slow-comm injection: inside the recorded interval


class RecordingAllGather(_UnitComm, AllGather):
    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:
        phase = getattr(self.rec, "phase", None)
        tag = f"fsdp.ag.{phase}" if phase in ("fwd", "bwd") else "fsdp.ag"
        with self._record("all_gather", output_tensor, group, tag):
            self._delay()
            return dist.all_gather_single(
                output_tensor, input_tensor, group=group, async_op=async_op
            )


class RecordingReduceScatter(_UnitComm, ReduceScatter):
    _input_next = True

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        # FSDP2 allocates the flat input (unsharded gradients), then the output shard, which
        # becomes the sharded gradients: only the input is a communication buffer.
        is_input, self._input_next = self._input_next, not self._input_next
        if is_input:
            return super().allocate(size, dtype=dtype, device=device)
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        with self._record("reduce_scatter", input_tensor, group, "fsdp.rs"):
            self._delay()
            return dist.reduce_scatter_single(
                output=output_tensor, input=input_tensor, group=group, op=op, async_op=async_op
            )


def register_fsdp_recording(
    rec: Recorder | NullRecorder,
    units: Sequence[tuple[FSDPModule, int | None]],
    delay_s: float = 0.0,
) -> UnshardedMeter:
    """Record the collectives of every `(unit, layer)` (layer None for the root) and declare
    their unsharded buffers; `delay_s` adds latency to each collective (slow-comm).

    Call after `fully_shard` and before the first forward. It replaces FSDP2's default
    communication objects (plain `torch.empty` buffers), so do not combine it with
    `set_symm_mem_for_comm` or `set_allocate_memory_from_process_group_for_comm`.
    """
    modules = [unit for unit, _ in units if isinstance(unit, nn.Module)]
    meter = UnshardedMeter(rec, modules)
    for unit, layer in units:
        assert isinstance(unit, nn.Module)
        numel = unsharded_numel(unit)
        unit.set_custom_all_gather(RecordingAllGather(rec, meter, numel, layer, delay_s))
        unit.set_custom_reduce_scatter(RecordingReduceScatter(rec, meter, numel, layer, delay_s))
    rec.on_step_end(meter.step_end)
    group = _shard_group(modules)
    if group is not None:  # the sharding group is the DP group, as DDP's is (ZeRO-3)
        size = dist.get_world_size(group)
        rec.declare_data_parallel(
            DataParallel(wrapper="fsdp", group=group, size=size, tag="fsdp.rs", zero_stage=3)
        )
    return meter


def _shard_group(units: Sequence[nn.Module]) -> Any:
    """The process group the units shard over: their parameters' 1-D device mesh (None for
    HSDP's 2-D mesh or without DTensor parameters: say the layout then)."""
    for unit in units:
        for param in unit.parameters():
            if isinstance(param, DTensor):
                mesh = param.device_mesh
                return mesh.get_group() if mesh.ndim == 1 else None
    return None
