"""How a layout's pipeline splits the model: the blocks of each stage's chunks, where the
embedding and the head sit, and how many blocks' activations each stage holds at its peak.

Two splits, the two Megatron-Core offers:
- the ends beside the blocks (its default): ceil(L / (p v)) blocks in every chunk (the
  heaviest chunk: an uneven split puts the extra blocks somewhere), the embedding on stage 0,
  the head on the last stage;
- the ends as a block each (Megatron-Core's `account_for_embedding_in_pipeline_split` and
  `account_for_loss_in_pipeline_split`; Llama 3, arXiv 2407.21783 section 3.3.2, one layer
  fewer on the first and the last stage): the L blocks and the two ends split evenly,
  (L + 2) / (p v) a chunk, so the first chunk holds one block fewer beside the embedding and
  the last one fewer beside the head. It needs p v to divide L + 2, and then it is never
  heavier than the other (the same blocks a chunk, less beside the ends), so the plan takes
  it whenever it can be built.

A stage's peak is found by replaying its order (`diag.contract.schedules.schedule_order`: 1F1B, or
Megatron's interleaved order, p micro-batches per chunk in turn): with chunks of unequal blocks the
peak can come after the warm-up (a light chunk's backward frees less than the next forward holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from diag.contract.schedules import schedule_order, warmup_forwards


@dataclass(frozen=True)
class Stage:
    """One pipeline GPU's share of the model."""

    index: int
    chunk_blocks: tuple[int, ...]  # blocks of each of its v model chunks
    embedding: bool
    head: bool

    @property
    def blocks(self) -> int:
        return sum(self.chunk_blocks)


def ends_as_blocks(layers: int, pp: int, v: int) -> bool:
    """Whether the balanced split (the embedding and the head a block each) can be built."""
    return pp > 1 and (layers + 2) % (pp * v) == 0


def stage_count_problem(layers: int, pp: int, v: int) -> str | None:
    """Why `pp` x `v` chunks cannot hold `layers` blocks, or None."""
    if pp * v <= layers or ends_as_blocks(layers, pp, v):
        return None
    return f"pp x v = {pp * v} stages for {layers} layers (and p v does not divide layers + 2)"


@lru_cache(maxsize=4096)
def stages(layers: int, pp: int, v: int) -> tuple[Stage, ...]:
    """The stages that can be the heaviest: the first, the second and the last (every middle
    stage holds what the second holds, and no more in flight)."""
    indices = sorted({0, min(1, pp - 1), pp - 1})
    if not ends_as_blocks(layers, pp, v):
        per_chunk = -(-layers // (pp * v))
        return tuple(Stage(r, (per_chunk,) * v, r == 0, r == pp - 1) for r in indices)
    per_chunk = (layers + 2) // (pp * v)
    out = []
    for r in indices:
        chunks = [per_chunk] * v
        if r == 0:
            chunks[0] -= 1  # global chunk 0: the embedding takes a block's place
        if r == pp - 1:
            chunks[-1] -= 1  # global chunk p v - 1: the head takes a block's place
        out.append(Stage(r, tuple(chunks), r == 0, r == pp - 1))
    return tuple(out)


REPLAY_LIMIT = 4096
"""Above this many micro-batch chunks a stage's order is not replayed: the bound stands in."""


def blocks_in_flight(stage: Stage, pp: int, microbatches: int) -> int:
    """Blocks (times micro-batches) whose activations `stage` holds at its peak: the real
    order replayed, each forward adding its chunk's blocks and each backward freeing them; for
    orders longer than REPLAY_LIMIT, the most chunks in flight times the largest chunk."""
    v = len(stage.chunk_blocks)
    if pp == 1:
        return stage.blocks
    schedule = "interleaved" if v > 1 else "1f1b"
    if microbatches * v > REPLAY_LIMIT:
        warmup = warmup_forwards(schedule, stage.index, pp, microbatches, v)
        return min(warmup + 1, microbatches * v) * max(stage.chunk_blocks)
    return _replayed_peak(schedule, stage.index, pp, microbatches, stage.chunk_blocks)


@lru_cache(maxsize=4096)
def _replayed_peak(
    schedule: str, index: int, pp: int, microbatches: int, chunk_blocks: tuple[int, ...]
) -> int:
    live = peak = 0
    for action in schedule_order(schedule, index, pp, microbatches, len(chunk_blocks)):
        blocks = chunk_blocks[action.chunk]
        live += blocks if action.kind == "fwd" else -blocks
        peak = max(peak, live)
    return peak
