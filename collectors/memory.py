"""Memory in six categories, each measured from the tensors (or allocator) that own it.

parameters, gradients, optimizer state: the tensors themselves (unique storages, local shards of
DTensors); activations: tensors saved for backward, alive at once (saved-tensor hooks); comm
buffers: what the trainer / DDP declares; fragmentation: CUDA caching allocator reserved minus
allocated (None on CPU: not measurable there, and never faked).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2, tensor parallel), the tensor itself otherwise."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr())


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views and aliases count once)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for tensor in tensors:
        t = _local(tensor)
        key = storage_key(t)
        if key in seen or key[1] == 0:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def param_bytes(model: torch.nn.Module) -> int:
    return unique_storage_bytes(model.parameters())


def grad_bytes(model: torch.nn.Module) -> int:
    return unique_storage_bytes(p.grad for p in model.parameters() if p.grad is not None)


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    tensors = (
        v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
    )
    return unique_storage_bytes(tensors)


def host_rss_bytes() -> int | None:
    """Resident set size of this process (Linux), for leaks outside the six categories."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
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
    for backward; a weakref finalizer tells when autograd lets it go. Parameters are excluded
    (they are counted as parameters) and each storage counts once however often it is saved.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[tuple[str, int], list[int]] = {}  # key -> [nbytes, references]
        self._excluded: set[tuple[str, int]] = set()
        self.live_bytes = 0
        self.peak_bytes = 0

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        self._excluded = {storage_key(_local(t)) for t in tensors}

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        with contextlib.suppress(Exception):  # never disturb autograd
            self._add(t)
        return t

    def _add(self, t: torch.Tensor) -> None:
        key = storage_key(t)
        if key in self._excluded or key[1] == 0:
            return
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                entry = self._live[key] = [t.untyped_storage().nbytes(), 0]
                self.live_bytes += entry[0]
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: tuple[str, int]) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del self._live[key]
                self.live_bytes -= entry[0]


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def memory_breakdown(
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    activations: SavedTensorTracker | None,
    comm_buffers: dict[str, int],
    device: torch.device,
) -> dict[str, Any]:
    """The six categories now (bytes; None where this device cannot measure one)."""
    cuda = cuda_allocator_stats(device)
    return {
        "params": param_bytes(model) if model is not None else None,
        "grads": grad_bytes(model) if model is not None else None,
        "optimizer": optimizer_bytes(optimizer) if optimizer is not None else None,
        "activations": activations.peak_bytes if activations is not None else None,
        "comm_buffers": sum(comm_buffers.values()),
        "fragmentation": cuda["reserved"] - cuda["allocated"] if cuda else None,
        "device_peak": cuda["peak"] if cuda else None,
        "host_rss": host_rss_bytes(),
        "source": "tensors+cuda_allocator" if cuda else "tensors",
    }
