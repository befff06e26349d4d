"""Memory in six categories, each measured from the tensors (or allocator) that own it.

parameters, gradients, optimizer state: the tensors themselves (unique storages, local shards of
DTensors); activations: tensors saved for backward, alive at once (saved-tensor hooks); comm
buffers: what the trainer / DDP declares; fragmentation: CUDA caching allocator reserved minus
allocated (None on CPU: not measurable there, and never faked).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_Parameter = torch.nn.Parameter


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2, tensor parallel), the tensor itself otherwise."""
    if type(t) in _PLAIN_TENSOR_TYPES:  # the common case, without a slow failed getattr
        return t
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def storage_ptr(t: torch.Tensor) -> int:
    """The address of the storage behind `t` (0 for a tensor without data).

    Host and device addresses do not overlap under CUDA's unified addressing, so the address
    alone identifies a storage across devices.
    """
    return _local(t).untyped_storage().data_ptr()


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views and aliases count once)."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        storage = _local(tensor).untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0 or ptr in seen:
            continue
        seen.add(ptr)
        total += storage.nbytes()
    return total


def param_bytes(params: Iterable[torch.Tensor]) -> int:
    return unique_storage_bytes(params)


def grad_bytes(params: Iterable[torch.Tensor]) -> int:
    return unique_storage_bytes(p.grad for p in params if p.grad is not None)


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    tensors = (
        v
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )
    return unique_storage_bytes(tensors)


class _Statm:
    """/proc/self/statm kept open: reading it is then a seek and a read, not an open."""

    file: Any = None


def host_rss_bytes() -> int | None:
    """Resident set size of this process (Linux), for leaks outside the six categories."""
    try:
        if _Statm.file is None:
            _Statm.file = open("/proc/self/statm", "rb", buffering=0)  # noqa: SIM115
        _Statm.file.seek(0)
        return int(_Statm.file.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def cuda_allocator_stats(device: torch.device) -> dict[str, int] | None:
    """Allocated, reserved and peak bytes of the CUDA caching allocator; None off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
        "peak": torch.cuda.max_memory_allocated(device),
    }


class SavedTensorTracker:
    """Bytes of tensors saved for backward that are alive, and the peak since `reset_peak()`.

    Installed as saved-tensor hooks around each step: `pack` sees every tensor autograd keeps
    for backward; a weak reference tells when autograd lets it go. Parameters are excluded
    (they are counted as parameters) and each storage counts once however often it is saved.
    Excluded are the watched parameters' storages and any `nn.Parameter` or view of one: the
    unsharded parameters of FSDP2 get new storage at every all-gather and lose it in place on
    reshard (no weak reference would fire); they are the all-gather buffers, counted once, as
    communication buffers (collectors/fsdp.py).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, _Saved] = {}  # storage address -> its bytes and saved references
        self._excluded: frozenset[int] = frozenset()
        self.live_bytes = 0
        self.peak_bytes = 0

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        self._excluded = frozenset(storage_ptr(t) for t in tensors)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        with contextlib.suppress(Exception):  # never disturb autograd
            self._add(t)
        return t

    def _add(self, t: torch.Tensor) -> None:
        if isinstance(t, _Parameter) or isinstance(t._base, _Parameter):
            # A parameter, or a view of one (`weight.t()` saved by a linear): counted as params,
            # or, for the unsharded parameters FSDP2 all-gathers, as communication buffers.
            return
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0 or ptr in self._excluded:
            return
        with self._lock:
            saved = self._live.get(ptr)
            if saved is None:
                saved = self._live[ptr] = _Saved(storage.nbytes())
                self.live_bytes += saved.nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            saved.refs.add(weakref.ref(t, functools.partial(self._release, ptr)))

    def _release(self, ptr: int, ref: weakref.ref[torch.Tensor]) -> None:
        with self._lock:
            saved = self._live.get(ptr)
            if saved is None:
                return
            saved.refs.discard(ref)
            if not saved.refs:
                del self._live[ptr]
                self.live_bytes -= saved.nbytes


class _Saved:
    __slots__ = ("nbytes", "refs")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.refs: set[weakref.ref[torch.Tensor]] = set()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def memory_breakdown(
    params: list[torch.Tensor] | None,
    optimizer: torch.optim.Optimizer | None,
    activations: SavedTensorTracker | None,
    comm_buffers: dict[str, int],
    device: torch.device,
) -> dict[str, Any]:
    """The six categories now (bytes; None where this device cannot measure one)."""
    cuda = cuda_allocator_stats(device)
    return {
        "params": param_bytes(params) if params is not None else None,
        "grads": grad_bytes(params) if params is not None else None,
        "optimizer": optimizer_bytes(optimizer) if optimizer is not None else None,
        "activations": activations.peak_bytes if activations is not None else None,
        "comm_buffers": sum(comm_buffers.values()),
        "fragmentation": cuda["reserved"] - cuda["allocated"] if cuda else None,
        "device_peak": cuda["peak"] if cuda else None,
        "host_rss": host_rss_bytes(),
        "source": "tensors+cuda_allocator" if cuda else "tensors",
    }
