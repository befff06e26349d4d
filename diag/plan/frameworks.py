"""What each training framework runs and keeps (`diag plan --framework`, docs/plan.md).

A framework sets two things. What it allows: the ZeRO stages it runs (and those it runs with
a pipeline), interleaving, context and sequence parallelism, expert parallelism, the
recomputation it offers; a layout outside them is rejected with the framework's reason. And
what it keeps per parameter, in bf16 mixed precision with Adam: `State`, bytes per parameter
of each memory category, held whole or sharded over the ZeRO group, with the fp32 gradient
buffers apart; plus a runtime reserve outside the caching allocator.

Without a framework (`GENERIC`, the default) the plan keeps the ZeRO paper's 16 B/param
(Rajbhandari et al. 2019, arXiv 1910.02054: bf16 params 2 + grads 2 + fp32 master 4 + Adam 8)
with DDP's bf16 flat gradient buffer and no reserve: the textbook figure, below what every
framework here keeps or equal to it. The sources of each profile are in docs/plan.md
("Frameworks"); the versions are those of 2024-25.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

GB = 1e9
RUNTIME_RESERVE_BYTES = 2 * GB
"""Device memory a PyTorch job holds outside the caching allocator's tensors: the CUDA
context (about 0.5 GB), NCCL's buffers (NCCL_BUFFSIZE, 4 MiB per protocol, channel and peer
of each communicator: hundreds of MB per communicator) and cuBLAS workspaces. An order of
magnitude, not a measurement (docs/plan.md)."""
ZERO2_BUCKET_BYTES = 5e8 * 2
"""DeepSpeed ZeRO-2's working gradients: its default reduce_bucket_size, 5e8 elements in
bf16, filled by the backward and reduce-scattered when full (at most the stage's gradients)."""
FP32_REDUCE_BUCKET_BYTES = 5e8 * 4
"""DeepSpeed's all-reduce of the bf16 optimizer's fp32 gradients at ZeRO 0-1: buckets of 5e8
elements (allreduce_bucket_size) flattened into a copy, fp32."""


@dataclass(frozen=True)
class PerParam:
    """Bytes per parameter: `whole` of every parameter the GPU holds, `sharded` of them
    divided over the ZeRO group (dp for the dense part, dp / ep for the experts)."""

    whole: float = 0.0
    sharded: float = 0.0


@dataclass(frozen=True)
class State:
    """What a GPU keeps per parameter at one ZeRO stage, by memory category."""

    params: PerParam
    grads: PerParam  # in bf16
    fp32_grads: PerParam  # fp32 gradient buffers (accumulation, reduction): shown in grads
    optimizer: PerParam  # fp32 master weights (where apart from params) and Adam's m, v
    flat_buffer: float = 0.0
    """B/param of a flat gradient buffer DDP reduces from (comm_buffers; dp > 1)."""
    grad_bucket_bytes: float = 0.0
    """A full-size gradient bucket beside the sharded gradients (grads; at most 2 B/param)."""
    reduce_bucket_bytes: float = 0.0
    """A flat fp32 copy the reduction works on (comm_buffers; at most the fp32 gradients)."""
    reduce_bytes: float = 2.0
    """B/param the gradient reduction moves: 4 where it reduces the fp32 gradients."""

    def bytes_per_param(self, dp: int) -> float:
        """Per parameter of the GPU's share, buckets and flat buffer left out."""
        parts = (self.params, self.grads, self.fp32_grads, self.optimizer)
        return sum(p.whole + p.sharded / dp for p in parts)


WHOLE_2, WHOLE_4, WHOLE_12 = PerParam(2), PerParam(4), PerParam(12)
SHARD_2, SHARD_4, SHARD_8, SHARD_12 = (PerParam(0, b) for b in (2, 4, 8, 12))
NONE = PerParam()

ZERO_PAPER = {
    0: State(WHOLE_2, WHOLE_2, NONE, WHOLE_12, flat_buffer=2),
    1: State(WHOLE_2, WHOLE_2, NONE, SHARD_12, flat_buffer=2),
    2: State(WHOLE_2, SHARD_2, NONE, SHARD_12, grad_bucket_bytes=ZERO2_BUCKET_BYTES),
    3: State(SHARD_2, SHARD_2, NONE, SHARD_12),
}
"""The default: 2 + 2 + 12 B/param, sharded as the ZeRO stage says (today's plan)."""
MEGATRON = {
    0: State(WHOLE_2, NONE, WHOLE_4, WHOLE_12, reduce_bytes=4),
    1: State(WHOLE_2, NONE, WHOLE_4, SHARD_12, reduce_bytes=4),
}
"""bf16 params, the fp32 main-grad buffer DDP reduces from (bf16 forces
--accumulate-allreduce-grads-in-fp32), fp32 master + Adam: 18 B/param, or 6 + 12/d with the
distributed optimizer (Megatron-LM docs/distrib_optimizer.md); the reduction moves the fp32
gradients."""
DEEPSPEED = {
    0: State(WHOLE_2, WHOLE_2, WHOLE_4, WHOLE_12, 0, 0, FP32_REDUCE_BUCKET_BYTES, 4),
    1: State(WHOLE_2, WHOLE_2, WHOLE_4, SHARD_12, 0, 0, FP32_REDUCE_BUCKET_BYTES, 4),
    2: State(WHOLE_2, SHARD_2, SHARD_4, SHARD_12, grad_bucket_bytes=ZERO2_BUCKET_BYTES),
    3: State(SHARD_2, SHARD_2, SHARD_4, SHARD_12),
}
"""ZeRO 0-1 in bf16 run the BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py): bf16 params
and grads, the full fp32 gradients it accumulates into and all-reduces, the fp32 master and
Adam partitioned; ZeRO 2-3 (stage_1_and_2.py, stage3.py) reduce the bf16 gradients and keep
the partition's gradients in fp32 for the step."""
FSDP_STATE = {
    0: State(WHOLE_4, NONE, WHOLE_4, PerParam(8), flat_buffer=4, reduce_bytes=4),
    2: State(PerParam(2, 4), NONE, SHARD_4, SHARD_8, reduce_bytes=4),
    3: State(PerParam(0, 4), NONE, SHARD_4, SHARD_8, reduce_bytes=4),
}
"""PyTorch FSDP with MixedPrecision(param_dtype=bf16, reduce_dtype=fp32): the sharded fp32
parameters are the optimizer's master weights, the gradients are reduce-scattered to fp32
shards; SHARD_GRAD_OP (ZeRO-2) keeps the gathered bf16 parameters from forward to backward.
ZeRO-0 is DDP under autocast: fp32 weights and gradients, DDP's fp32 buckets."""
TORCHTITAN_PIPELINED = {
    0: FSDP_STATE[0],
    2: State(PerParam(2, 4), NONE, PerParam(4, 4), SHARD_8, reduce_bytes=4),
    3: State(PerParam(0, 4), NONE, PerParam(4, 4), SHARD_8, reduce_bytes=4),
}
"""FSDP2 under a pipeline schedule (torch.distributed.pipelining): gradient sync is off until
the last micro-batch, so the unsharded gradients accumulate in the reduce dtype (fp32) over
the micro-batches and are reduce-scattered once a step."""


@dataclass(frozen=True, eq=False)
class Framework:
    """One framework's offers and what it keeps (compared by identity: one of each)."""

    key: str
    name: str
    zero_stages: tuple[int, ...]
    """The ZeRO stages it runs (0: plain data parallelism)."""
    pipeline_zero: tuple[int, ...]
    """The stages it runs with pp > 1 (empty: it has no pipeline schedule)."""
    pipeline_refusal: str
    """Why a layout with pp > 1 and another stage cannot run."""
    state: dict[int, State]
    pipelined_state: dict[int, State] = field(default_factory=dict)
    """What it keeps with pp > 1 where that differs (default: `state`)."""
    recompute: tuple[str, ...] = ("none", "selective", "full")
    max_v: int = 8  # interleaved virtual stages (1: no interleaved schedule)
    max_cp: int = 8  # context parallelism (1: none)
    sequence_parallel: bool = True
    expert_parallel: bool = True
    reserve_bytes: float = RUNTIME_RESERVE_BYTES

    def state_at(self, zero: int, pp: int) -> State:
        """What it keeps at `zero` with `pp` stages; a stage it does not run (a layout it
        rejects) is priced as the ZeRO paper's."""
        state = self.state.get(zero, ZERO_PAPER[zero])
        return self.pipelined_state.get(zero, state) if pp > 1 else state

    def reductions(self, zero: int, pp: int, microbatches: int) -> int:
        """Gradient reductions a step: one at ZeRO 0-1 and where the unsharded gradients
        accumulate over the micro-batches (FSDP2 under a pipeline schedule); else one per
        micro-batch (a shard cannot accumulate the next micro-batch's full gradients)."""
        if zero < 2 or (pp > 1 and zero in self.pipelined_state):
            return 1
        return microbatches

    def problem(self, zero: int, pp: int, v: int, cp: int, ep: int, recompute: str) -> str | None:
        """Why this framework cannot run a layout of these sizes, or None."""
        if zero not in self.zero_stages:
            stages = ", ".join(map(str, self.zero_stages))
            return f"{self.key} runs ZeRO {stages}, not {zero} ({self.name})"
        if pp > 1 and zero not in self.pipeline_zero:
            return self.pipeline_refusal
        checks = (
            (v > self.max_v, f"{self.key} has no interleaved pipeline schedule (v={v})"),
            (cp > self.max_cp, f"{self.key} has no context parallelism (cp={cp})"),
            (ep > 1 and not self.expert_parallel, f"{self.key} has no expert parallelism"),
            (
                recompute not in self.recompute,
                f"{self.key} offers recomputation {', '.join(self.recompute)}, not {recompute}",
            ),
        )
        return next((why for bad, why in checks if bad), None)


GENERIC = Framework(
    "generic",
    "the ZeRO paper's state, no framework's buffers",
    (0, 1, 2, 3),
    (0, 1, 2, 3),
    "",
    ZERO_PAPER,
    reserve_bytes=0.0,
)
DEEPSPEED_PIPELINE = (
    "DeepSpeed's pipeline engine refuses ZeRO-2/3 with pp > 1 "
    "(deepspeed/runtime/pipe/engine.py asserts zero_stage < 2): ZeRO-1 or no pipeline"
)
FRAMEWORKS: dict[str, Framework] = {
    "megatron": Framework(
        "megatron",
        "Megatron-LM / Megatron-Core: ZeRO-1 is its distributed optimizer",
        (0, 1),
        (0, 1),
        "",
        MEGATRON,
    ),
    "nemo": Framework(
        "nemo",
        "NeMo 2 on Megatron-Core: ZeRO-1 is its distributed optimizer",
        (0, 1),
        (0, 1),
        "",
        MEGATRON,
    ),
    "deepspeed": Framework(
        "deepspeed",
        "DeepSpeed with Megatron-DeepSpeed's model: ZeRO 0-3, its pipeline engine",
        (0, 1, 2, 3),
        (0, 1),
        DEEPSPEED_PIPELINE,
        DEEPSPEED,
        recompute=("none", "full"),
        max_v=1,
        max_cp=1,
    ),
    "fsdp": Framework(
        "fsdp",
        "PyTorch FSDP: NO_SHARD / SHARD_GRAD_OP / FULL_SHARD, with Megatron-style TP",
        (0, 2, 3),
        (),
        "fsdp has no pipeline schedule (pp=1): torchtitan runs FSDP with one",
        FSDP_STATE,
        recompute=("none", "full"),
        max_v=1,
        max_cp=1,
        sequence_parallel=False,
        expert_parallel=False,
    ),
    "torchtitan": Framework(
        "torchtitan",
        "torchtitan: FSDP2 with TP/SP, pipeline schedules, CP and EP",
        (0, 2, 3),
        (0, 2, 3),
        "",
        FSDP_STATE,
        TORCHTITAN_PIPELINED,
    ),
}
"""The frameworks `--framework` names."""


MEGATRON_FP16 = replace(
    FRAMEWORKS["megatron"],
    name="Megatron-LM in fp16, before bf16 (2019-21)",
    state={
        0: State(WHOLE_2, WHOLE_2, WHOLE_4, WHOLE_12),
        1: State(WHOLE_2, WHOLE_2, SHARD_4, SHARD_12),
    },
)
"""Megatron-LM's fp16 training, not a `--framework` key (the plan counts bf16): fp16 params
and grads (the buffer DDP all-reduces), the fp32 gradients the optimizer steps on, fp32
master + Adam: 20 B/param, or 4 + 16/d (docs/distrib_optimizer.md's fp16 row). The published
jobs of 2019-21 (benchmarks/plan_published.py)."""


def framework_by_key(key: str | None) -> Framework:
    """The framework `key` names; None: GENERIC. KeyError for an unknown key."""
    return GENERIC if key is None else FRAMEWORKS[key]
