"""What to simulate: the layout, the model, the run; validated with one-line errors."""

from __future__ import annotations

from dataclasses import dataclass, field

from diag.contract import ledger
from diag.contract.input_rules import check_counts, check_model, check_zero_stage, tp_split_problem
from diag.contract.names import SCHEDULES
from diag.contract.schedules import check_layout
from simulator.hardware import HardwareSpec


class SimulationError(ValueError):
    """A configuration that cannot be simulated; the message is one line naming the values."""


@dataclass(frozen=True)
class ModelSpec:
    """A GPT (GPT-2 style blocks, Megatron-split under TP); `experts` > 0 makes every block's
    feed-forward layer a mixture of experts (as the ep trainer does)."""

    layers: int = 8
    hidden: int = 4096
    heads: int = 32
    seq_len: int = 2048
    micro_batch: int = 1  # sequences per micro-batch per data-parallel (and expert-parallel) rank
    vocab: int = 50304
    ffn_hidden: int | None = None  # default 4 x hidden
    experts: int = 0  # 0: dense
    topk: int = 2
    capacity_factor: float = 1.25
    aux_loss_coef: float = 0.01
    dtype: str = "bf16"  # parameters, gradients, activations and messages
    lm_head: bool = True  # the LM head (and its FLOPs) on the last stage; off for pure theory
    kv_heads: int | None = None  # grouped-query attention's key/value heads; None: = heads
    gated_mlp: bool = False  # a SwiGLU MLP (three h x f matrices, no biases) as in Llama
    tied_embeddings: bool = True  # the LM head shares the token embedding (when pp = 1)
    learned_positions: bool = True  # a seq x h position table (False: rotary, no parameters)

    @property
    def kv_hidden(self) -> int:
        """Width of the key (and of the value) projection: h for multi-head attention."""
        heads = self.heads if self.kv_heads is None else self.kv_heads
        return self.hidden // self.heads * heads

    @property
    def ffn(self) -> int:
        return 4 * self.hidden if self.ffn_hidden is None else self.ffn_hidden

    @property
    def dtype_bytes(self) -> int:
        return ledger.dtype_bytes(self.dtype)

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one rank."""
        return self.micro_batch * self.seq_len


@dataclass(frozen=True)
class SimConfig:
    """One simulated job: ranks = dp x pp x ep x tp, laid out as the reference trainers do
    (reference_runs/topology.py: tp innermost, then ep, pp, dp)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    gpus_per_node: int = 8
    steps: int = 10
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero_stage: int = 0
    bucket_mb: float = 25.0  # DDP bucket size, MiB (at most MAX_BUCKETS buckets are simulated)
    model: ModelSpec = field(default_factory=ModelSpec)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    inject: tuple[str, ...] = ()
    seed: int = 0
    jitter: float = 0.02  # lognormal sigma of each rank's compute per micro-batch
    opt_ms: float | None = None  # optimizer step time; None: optimizer bytes over HBM bandwidth
    fragmentation: float = 0.05  # allocator fragmentation, a share of the allocated bytes
    ranks: int | None = None  # the world size to check the layout against (None: the product)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.ep

    @property
    def chunks(self) -> int:
        return self.virtual_stages

    @property
    def layers_per_chunk(self) -> int:
        return self.model.layers // (self.pp * self.virtual_stages)

    def check(self) -> None:
        """SimulationError (one line) naming what cannot be simulated."""
        try:
            self._check()
        except ValueError as err:
            raise SimulationError(str(err)) from None

    def _check(self) -> None:
        m = self.model
        check_counts({"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep})
        if self.ranks is not None and self.world_size != self.ranks:
            raise ValueError(
                f"layout dp={self.dp} x tp={self.tp} x pp={self.pp} x ep={self.ep} = "
                f"{self.world_size} ranks, but --ranks is {self.ranks}"
            )
        check_counts(
            {
                "gpus_per_node": self.gpus_per_node,
                "steps": self.steps,
                "microbatches": self.microbatches,
                "virtual_stages": self.virtual_stages,
            }
        )
        check_model(m)  # the shape rules `diag plan` applies too (diag/contract/input_rules.py)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        check_layout(self.schedule, m.layers, self.pp, self.microbatches, self.virtual_stages)
        tp_problem = tp_split_problem(m, self.tp)
        if tp_problem is not None:
            raise ValueError(tp_problem)
        if self.ep > 1 and m.experts == 0:
            raise ValueError(f"ep={self.ep} needs a mixture-of-experts model (--experts > 0)")
        if m.experts and m.experts % self.ep:
            raise ValueError(f"experts ({m.experts}) must be divisible by ep ({self.ep})")
        m.dtype_bytes  # noqa: B018  (raises ValueError on an unknown dtype)
        check_zero_stage(self.zero_stage)
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {self.bucket_mb}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.opt_ms is not None and not 0 <= self.opt_ms < float("inf"):
            raise ValueError(f"opt_ms must be a finite number >= 0, got {self.opt_ms}")
        if not 0 <= self.fragmentation < 10:
            raise ValueError(f"fragmentation must be in [0, 10), got {self.fragmentation}")
        self.hardware.check()


# --- Parameters ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer block held by one rank (its TP shard, its experts)."""

    dense: int  # attention, LayerNorms and the dense MLP or the router
    experts: int  # the rank's experts (0 for a dense model)

    @property
    def total(self) -> int:
        return self.dense + self.experts


def layer_params(model: ModelSpec, tp: int = 1, ep: int = 1) -> LayerParams:
    """One block's parameters on one rank: weights split by tp (Megatron), experts by ep.
    tp = ep = 1 gives the whole block of ledger.gpt_param_count."""
    h, f, kv = model.hidden, model.ffn, model.kv_hidden
    qkv = h * (h + 2 * kv) + h + 2 * kv
    attn = qkv // tp + h * h // tp + h  # qkv (column) + proj (row) + proj bias
    norms = 4 * h
    mlp = 3 * h * f // tp if model.gated_mlp else 2 * h * f // tp + f // tp + h
    if not model.experts:
        return LayerParams(attn + norms + mlp, 0)
    router = h * model.experts
    return LayerParams(attn + norms + router, model.experts // ep * mlp)


def stage_params(config: SimConfig, stage: int) -> LayerParams:
    """Parameters of pipeline rank `stage` (all its chunks) on one of its ranks."""
    model, tp, pp = config.model, config.tp, config.pp
    block = layer_params(model, tp, config.ep)
    n = config.layers_per_chunk * config.chunks
    dense, experts = block.dense * n, block.experts * n
    h = model.hidden
    chunks = [c * pp + stage for c in range(config.chunks)]
    last = pp * config.chunks - 1
    if 0 in chunks:
        dense += model.vocab * h // tp  # token embedding (vocab-parallel)
        dense += model.seq_len * h if model.learned_positions else 0
    if last in chunks:
        dense += 2 * h  # final LayerNorm
        if pp > 1 or not model.tied_embeddings:
            dense += model.vocab * h // tp  # untied LM head (tied to the embedding when pp = 1)
    return LayerParams(dense, experts)


def model_params(config: SimConfig) -> int:
    """Parameters of the whole model (one replica, every expert)."""
    one = SimConfig(model=config.model, pp=config.pp, virtual_stages=config.virtual_stages)
    return sum(stage_params(one, stage).total for stage in range(config.pp))
