"""The synthetic run's model and cluster (benchmarks/synthetic_run.py): the GPT every rank
trains, the hosts the ranks sit on, the run's clock and the shape of one run."""

from __future__ import annotations

from dataclasses import dataclass

from diag.contract import ledger

RANKS_PER_HOST = 8
RUN_START_NS = 1_767_225_600 * 10**9
"""2026-01-01T00:00:00Z: the run's clock (ns since the epoch) at the first step."""
RUN_CREATED = "2026-01-01T00:00:00+00:00"

# The model: a small GPT in float32, as the reference trainers run on CPU.
LAYERS, HIDDEN, HEADS, SEQ_LEN, MICRO_BATCH, VOCAB = 4, 256, 4, 256, 8, 8192
FFN_HIDDEN = 4 * HIDDEN
DTYPE, DTYPE_BYTES = "float32", 4
MOE_LAYERS = (1, 3)  # every other block's MLP is a MoE layer
TOPK, CAPACITY_FACTOR, AUX_LOSS_COEF = 2, 1.25, 0.01
BUCKET_MB = 64.0  # the gradients (22 MB dense, 51 MB with 8 experts) fit one bucket

# The cluster: gloo bandwidth per rank within a host and across hosts.
INTRA_NODE_GBPS, INTER_NODE_GBPS = 10.0, 3.0


@dataclass(frozen=True)
class RunShape:
    """The arguments of one synthetic run."""

    ranks: int
    steps: int
    microbatches: int
    experts: int
    straggler_rank: int | None
    seed: int

    @property
    def tokens_per_microbatch(self) -> int:
        return MICRO_BATCH * SEQ_LEN

    @property
    def tokens_per_step(self) -> int:
        return self.tokens_per_microbatch * self.microbatches

    @property
    def topk(self) -> int:
        return min(TOPK, self.experts)


def param_count(experts: int) -> int:
    """The GPT's parameters; a MoE layer holds `experts` MLPs and a router instead of one MLP."""
    dense = ledger.gpt_param_count(LAYERS, HIDDEN, VOCAB, SEQ_LEN, FFN_HIDDEN)
    if experts <= 0:
        return dense
    mlp = 2 * HIDDEN * FFN_HIDDEN + FFN_HIDDEN + HIDDEN
    router = HIDDEN * experts
    return dense + len(MOE_LAYERS) * ((experts - 1) * mlp + router)


def host_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_HOST}"
