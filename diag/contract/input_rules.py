"""The rules a job's inputs obey, shared by `diag plan` (diag/plan/inputs.py) and `diag
simulate` (`SimConfig.check`): a model's shape, a parallel size, a ZeRO stage, a device.

Each rule raises `RuleError` naming the field it is about (the simulator's field names:
`heads`, `kv_heads`, `zero_stage`, `mfu`, ...) and why; each command says it in its own
words (`diag plan` names its option: `--kv-heads: 16 is more than the 8 heads`). Standard
library only, and nothing from the simulator or the planner: both import this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

ZERO_STAGES = (0, 1, 2, 3)
"""ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054): 0 none, 1 the optimizer state sharded
over dp, 2 also the gradients, 3 also the parameters."""


class RuleError(ValueError):
    """An input a rule refuses: `field` names it, `reason` says why (with the values).

    `str()` is one line, "FIELD REASON" (`kv_heads 3 does not divide the 8 heads ...`)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = " ".join(reason.split())
        super().__init__(f"{field} {self.reason}")


class ModelShape(Protocol):
    """What the rules read of a model (simulator.config.ModelSpec has it)."""

    @property
    def layers(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int | None: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def vocab(self) -> int: ...
    @property
    def micro_batch(self) -> int: ...
    @property
    def experts(self) -> int: ...
    @property
    def topk(self) -> int: ...
    @property
    def capacity_factor(self) -> float: ...
    @property
    def ffn(self) -> int: ...


class Device(Protocol):
    """What the rules read of a device and its links (simulator.hardware.HardwareSpec)."""

    @property
    def device_tflops(self) -> float: ...
    @property
    def mfu(self) -> float: ...
    @property
    def hbm_GBps(self) -> float: ...
    @property
    def device_memory_gb(self) -> float: ...
    @property
    def intra_node_GBps(self) -> float: ...
    @property
    def inter_node_GBps(self) -> float: ...
    @property
    def nccl_efficiency(self) -> float: ...
    @property
    def intra_latency_us(self) -> float: ...
    @property
    def inter_latency_us(self) -> float: ...
    @property
    def comm_scale(self) -> float: ...


def check_counts(counts: Mapping[str, int]) -> None:
    """Each count (a size, a number of micro-batches) is a whole number >= 1."""
    for field, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RuleError(field, f"must be a whole number >= 1, got {value}")


def check_positive(values: Mapping[str, float]) -> None:
    """Each value (a bandwidth, a memory, a peak) is a finite number > 0."""
    for field, value in values.items():
        if not (value > 0 and math.isfinite(value)):
            raise RuleError(field, f"must be a finite number > 0, got {value}")


def check_share(field: str, value: float) -> None:
    """A share of a peak: in (0, 1]."""
    if not 0 < value <= 1:
        raise RuleError(field, f"must be in (0, 1], got {value}")


def check_zero_stage(stage: int) -> None:
    if stage not in ZERO_STAGES:
        raise RuleError(
            "zero_stage",
            f"{stage} is not a ZeRO stage: 0 (none), 1 (optimizer state sharded), "
            "2 (and gradients) or 3 (and parameters)",
        )


def check_model(model: ModelShape) -> None:
    """A transformer that can be built: whole sizes, heads that split the width, key/value
    heads that group the heads, a mixture of at least two experts routing to at most all."""
    check_counts(
        {
            "layers": model.layers,
            "hidden": model.hidden,
            "heads": model.heads,
            "seq_len": model.seq_len,
            "vocab": model.vocab,
            "ffn_hidden": model.ffn,
            "micro_batch": model.micro_batch,
        }
    )
    if model.hidden % model.heads:
        raise RuleError(
            "heads",
            f"{model.heads} does not divide hidden ({model.hidden}): "
            "each head is hidden / heads wide",
        )
    kv = model.kv_heads
    if kv is not None:
        check_counts({"kv_heads": kv})
        if kv > model.heads:
            raise RuleError("kv_heads", f"{kv} is more than the {model.heads} heads")
        if model.heads % kv:
            raise RuleError(
                "kv_heads",
                f"{kv} does not divide the {model.heads} heads: "
                "each key/value head serves heads / kv_heads query heads",
            )
    if model.experts < 0 or model.experts == 1:
        raise RuleError("experts", f"must be 0 (dense) or >= 2 (a mixture), got {model.experts}")
    if model.experts and not 1 <= model.topk <= model.experts:
        raise RuleError(
            "topk",
            f"{model.topk} is not in 1..experts ({model.experts}): "
            "each token goes to topk distinct experts",
        )
    if model.experts:
        check_positive({"capacity_factor": model.capacity_factor})


def tp_split_problem(model: ModelShape, tp: int) -> str | None:
    """Why Megatron's tensor parallelism cannot split `model` over `tp` ranks (the heads,
    the key/value heads and the MLP's width each divide by tp), or None."""
    kv = model.heads if model.kv_heads is None else model.kv_heads
    sizes = {"heads": model.heads, "kv heads": kv, "ffn": model.ffn}
    bad = [f"{name} ({value})" for name, value in sizes.items() if value % tp]
    if not bad:
        return None
    return f"tp={tp} does not divide {', '.join(bad)} (each must be divisible by tp ({tp}))"


def check_device(device: Device) -> None:
    """A device that computes and links that carry bytes: peaks, memory and bandwidths
    finite and > 0, shares of a peak in (0, 1], latencies finite and >= 0."""
    check_positive(
        {
            "device_tflops": device.device_tflops,
            "hbm_GBps": device.hbm_GBps,
            "device_memory_gb": device.device_memory_gb,
            "intra_node_GBps": device.intra_node_GBps,
            "inter_node_GBps": device.inter_node_GBps,
        }
    )
    check_share("mfu", device.mfu)
    check_share("nccl_efficiency", device.nccl_efficiency)
    latencies = {
        "intra_latency_us": device.intra_latency_us,
        "inter_latency_us": device.inter_latency_us,
        "comm_scale": device.comm_scale,
    }
    for field, value in latencies.items():
        if not 0 <= value < float("inf"):
            raise RuleError(field, f"must be a finite number >= 0, got {value}")
