"""What `diag plan` lays out: the job (model, batch), the cluster, and one candidate layout.

Layout terms (Megatron's, docs/physics.md): the world is tp x cp x pp x dp GPUs; ep splits the
experts over ep of the dp ranks (expert parallelism inside data parallelism, as Megatron-Core does),
so it does not multiply the world. `global_batch = micro_batch x microbatches x dp` sequences per
step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from diag.contract.devices import DeviceSpec
from diag.plan.frameworks import GENERIC, Framework
from simulator.config import ModelSpec, SimConfig, model_params
from simulator.hardware import HardwareSpec

RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation: none; selective (Korthikanti 2022: the attention scores are
recomputed, the rest kept); full (only each layer's input is kept, the forward runs twice)."""


@dataclass(frozen=True)
class Cluster:
    """GPUs, how many per node, and what each computes and carries (the simulator's spec)."""

    gpus: int
    gpus_per_node: int
    hardware: HardwareSpec
    device_key: str | None = None  # the devices.py entry it came from (None: a calibrated one)
    overhead_s: float = 0.0  # fixed host time per step outside compute and communication
    pass_overhead_s: float = 0.0
    """Fixed time of each forward or backward pass of one micro-batch through one chunk of
    layers, whatever its FLOPs (launches, the framework's per-call work): calibrated on a
    measured run (`diag plan --from`), 0 for a cluster of the device table."""
    given: tuple[tuple[str, float], ...] = ()
    """What the user set over the device table's entry: (HardwareSpec field or
    "gpus_per_node", value), in the order given; the header names them."""

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def memory_bytes(self) -> float:
        return self.hardware.device_memory_gb * 1e9

    @property
    def peak_flops_per_s(self) -> float:
        return self.hardware.device_tflops * 1e12


def cluster_from_device(
    device: DeviceSpec, gpus: int, gpus_per_node: int | None = None, **overrides: float
) -> Cluster:
    """The cluster of `gpus` devices of the table's `device`, its compute at the device's
    `compute_efficiency`; `overrides` replace fields of the simulator's HardwareSpec
    (device_memory_gb, intra_node_GBps, mfu, ...) and are kept as `Cluster.given`. Unchecked:
    `make_plan` checks every input (diag.plan.inputs)."""
    hardware = HardwareSpec(
        device_name=device.name,
        device_tflops=device.peak_tflops_bf16,
        mfu=device.compute_efficiency,
        hbm_GBps=device.hbm_GBps,
        device_memory_gb=device.memory_gb,
        intra_node_GBps=device.intra_node_GBps,
        inter_node_GBps=device.inter_node_GBps,
    )
    hardware = replace(hardware, **overrides)  # type: ignore[arg-type]
    given = tuple(overrides.items())
    if gpus_per_node is not None:
        given += (("gpus_per_node", float(gpus_per_node)),)
    per_node = device.gpus_per_node if gpus_per_node is None else gpus_per_node
    return Cluster(gpus, per_node, hardware, device.key, given=given)


@dataclass(frozen=True)
class Training:
    """How the job trains its blocks, beyond their shape: what the activations hold and what
    the backward recomputes. The defaults are Korthikanti 2022's GPT block (the seed's
    formula); the presets carry their papers' (diag.plan.models.TRAINING)."""

    flash_attention: bool = False
    """Fused attention (Dao 2022): the s x s scores are never stored; the backward recomputes
    them from Q and K (2 b s^2 h FLOPs a layer). Standard since 2022; Llama 3 uses it."""
    dropout: bool = True
    """Dropout after attention and the MLP (and on the scores without flash attention), whose
    masks are stored: GPT-3, Megatron-LM, MT-NLG. Llama and Mixtral train without it."""


@dataclass(frozen=True)
class Job:
    """The model and the batch to lay out; `params` overrides the architecture's count (the
    seed's round 70B) and scales every per-GPU share of it."""

    model: ModelSpec
    global_batch: int  # sequences per optimizer step
    micro_batch: int = 1  # sequences per micro-batch per data-parallel rank
    params: float | None = None
    training: Training = field(default_factory=Training)
    framework: Framework = GENERIC
    """What the framework runs and keeps (diag.plan.frameworks); GENERIC: the ZeRO paper's
    16 B/param, no framework's buffers, no reserve."""

    @property
    def architecture_params(self) -> int:
        return _architecture_params(self.model)

    @property
    def total_params(self) -> float:
        return float(self.architecture_params if self.params is None else self.params)

    @property
    def param_scale(self) -> float:
        """total_params over the architecture's count (1 unless --params overrides it)."""
        return self.total_params / self.architecture_params

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.model.seq_len


@lru_cache(maxsize=256)
def _architecture_params(model: ModelSpec) -> int:
    """The whole model's parameters, counted once per model: every per-GPU share of every
    layout scales by it (a search asked for it 160,000 times, half its time)."""
    return model_params(SimConfig(model=model))


@dataclass(frozen=True)
class Layout:
    """One way to lay the job out."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0  # ZeRO stage 0-3 over the dp group
    microbatches: int = 1  # per step per pipeline (gradient accumulation without a pipeline)
    v: int = 1  # interleaved 1F1B virtual stages per GPU
    recompute: str = "none"
    sequence_parallel: bool = field(default=True)  # with tp > 1 (Korthikanti 2022)

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def key(self) -> str:
        """`dp=8,tp=8,pp=35,...`: the spelling `--layout` reads and the JSON carries."""
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        parts += [f"cp={self.cp}"] if self.cp > 1 else []
        parts += [f"ep={self.ep}"] if self.ep > 1 else []
        parts += [f"zero={self.zero}", f"m={self.microbatches}"]
        parts += [f"v={self.v}"] if self.v > 1 else []
        parts.append(f"recompute={self.recompute}")
        return ",".join(parts)
