"""GPU kernels classified as computation, communication or memory, by name.

Communication covers NCCL (`ncclKernel_*`, `ncclDevKernel_*`), RCCL (ROCm's NCCL, same names,
plus `rccl*`), custom all-to-all libraries (DeepEP's `...ep::...dispatch/combine/notify...`,
DeepSeek-V3's trace, and `deep_ep` kernels) and all-reduces outside NCCL (PyTorch's
symmetric memory, vLLM's and TensorRT-LLM's custom all-reduce) and Transformer Engine's
userbuffers (tensor-parallel communication overlapped with GEMMs). Memory: Kineto's
`gpu_memcpy` / `gpu_memset` events and kernels named `Memcpy*` / `Memset*`. Everything else
computes. The patterns are regular expressions, replaceable through `KernelPatterns`
(`[kineto]` in a --config file).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np


class KernelClass(StrEnum):
    COMPUTE = "compute"
    COMM = "comm"
    MEMORY = "memory"
    OTHER = "other"  # on the `other` list: neither (HTA's synchronisation events, launches)


DEFAULT_COMM_PATTERNS = (
    r"^nccl",  # ncclKernel_AllReduce_..., ncclDevKernel_SendRecv(...)
    r"^rccl",
    r"ep::(?:\w+::)*\w*(?:dispatch|combine|notify)",  # DeepEP: dpsk::ep::internode::dispatch
    r"deep_ep",
    # PyTorch's symmetric-memory collectives (torch.ops.symm_mem: `multimem_all_reduce_`,
    # `one_shot_all_reduce`; vLLM's TP all-reduce) and vLLM's and TensorRT-LLM's own
    r"(?:multimem|one_shot|two_shot)_all_(?:reduce|gather)",
    r"cross_device_reduce_\d?stage",
    r"(?:one|two)ShotAllReduce",
    # Transformer Engine's userbuffers (Megatron's TP communication overlap): its all-gathers
    # and reduce-scatters (`userbuffers_fp16_sum_inplace_gpu_rw_ag<2>`, `..._rr_rs_oop`) and
    # the ring's pushes and pulls (`kuserbuffers_pushsendrecv`)
    r"userbuffers_",
)
DEFAULT_MEMORY_PATTERNS = (r"^Memcpy", r"^Memset")
COPY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset"})
"""Kineto event categories of device memory copies and sets (not the six memory categories)."""

# Collective from a communication kernel's name, when no record_param_comms names it.
_OP_BY_NAME = (
    (re.compile(r"userbuffers\w*_ag(?![a-z])", re.I), "all_gather"),
    (re.compile(r"userbuffers\w*_rs(?![a-z])", re.I), "reduce_scatter"),
    (re.compile(r"all_?reduce|cross_device_reduce", re.I), "all_reduce"),
    (re.compile(r"all_?gather", re.I), "all_gather"),
    (re.compile(r"reduce_?scatter", re.I), "reduce_scatter"),
    (re.compile(r"all_?to_?all|dispatch|combine|notify", re.I), "all_to_all"),
    (re.compile(r"broadcast", re.I), "broadcast"),
    (re.compile(r"sendrecv|send", re.I), "send"),
    (re.compile(r"recv", re.I), "recv"),
    (re.compile(r"reduce", re.I), "reduce"),
)


@dataclass(frozen=True)
class KernelPatterns:
    """Regular expressions (searched in the name) for communication and memory kernels, and
    names that are neither computation nor those (`other`); `by_category`: Kineto's
    gpu_memcpy / gpu_memset categories are memory whatever the name."""

    comm: Sequence[str] = DEFAULT_COMM_PATTERNS
    memory: Sequence[str] = DEFAULT_MEMORY_PATTERNS
    other: Sequence[str] = ()
    by_category: bool = True
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        never = r"(?!)"
        compiled = tuple(
            re.compile("|".join(p) if p else never) for p in (self.comm, self.memory, self.other)
        )
        object.__setattr__(self, "_compiled", compiled)

    def classify(self, names: Iterable[str], categories: Iterable[str]) -> np.ndarray:
        """A `KernelClass` value per kernel (object array)."""
        comm, memory, other = self._compiled
        keys = list(zip(names, categories, strict=True))
        memo: dict[tuple[str, str], str] = {}
        for key in dict.fromkeys(keys):  # each (name, category) once
            name, category = key
            if comm.search(name):
                kind = KernelClass.COMM.value
            elif memory.search(name) or (self.by_category and category in COPY_CATEGORIES):
                kind = KernelClass.MEMORY.value
            elif other.search(name):
                kind = KernelClass.OTHER.value
            else:
                kind = KernelClass.COMPUTE.value
            memo[key] = kind
        out = list(map(memo.__getitem__, keys))
        return np.array(out, dtype=object)


def op_from_kernel_name(name: str) -> str | None:
    for pattern, op in _OP_BY_NAME:
        if pattern.search(name):
            return op
    return None
