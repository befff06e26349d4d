"""The memory of a simulated rank in the six categories (docs/metrics.md), per pipeline stage:
what ZeRO shards, the activations the schedule keeps alive, the communication buffers."""

from __future__ import annotations

from dataclasses import dataclass

from diag.contract import ledger
from diag.contract.schedules import Action, peak_in_flight
from simulator.config import SimConfig


@dataclass
class StageMemory:
    """The six categories of one stage's ranks, without the leak (bytes)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    comm_buffers: float

    def at_step(
        self, step: int, leak_bytes_per_step: float, fragmentation: float
    ) -> dict[str, int]:
        """The categories (+ device_peak) at the end of `step`, the leak grown until then."""
        activations = self.activations + leak_bytes_per_step * (step + 1)
        allocated = self.params + self.grads + self.optimizer + activations + self.comm_buffers
        return {
            "params": int(self.params),
            "grads": int(self.grads),
            "optimizer": int(self.optimizer),
            "activations": int(activations),
            "comm_buffers": int(self.comm_buffers),
            "fragmentation": int(allocated * fragmentation),
            "device_peak": int(allocated),
        }


def stage_memory(
    config: SimConfig, params: int, order: list[Action], holds_head: bool, pp_bytes: int,
    ep_bytes: int,
) -> StageMemory:  # fmt: skip
    """One stage's ranks: `params` the parameters they hold, `order` their schedule (the
    activations of the forwards in flight), `holds_head` whether they compute the logits,
    `pp_bytes` / `ep_bytes` one message's payload."""
    model, dp, zero = config.model, config.dp, config.zero_stage
    db = model.dtype_bytes
    # the ledger counts 16-bit activations
    per_layer = ledger.activation_bytes_per_layer(
        model.seq_len, model.micro_batch, model.hidden, model.heads, config.tp
    ) * (db / 2)
    activations = per_layer * config.layers_per_chunk * peak_in_flight(order)
    if holds_head:
        activations += model.tokens * model.vocab / config.tp * 4  # fp32 logits
    comm = float(params * db if dp > 1 else 0)  # the DDP buckets
    comm += 2 * pp_bytes if config.pp > 1 else 0
    comm += 4 * ep_bytes * model.capacity_factor if config.ep > 1 else 0
    return StageMemory(
        params=params * db / (dp if zero >= 3 else 1),
        grads=params * db / (dp if zero >= 2 else 1),
        optimizer=params * ledger.ADAM_OPTIMIZER_BYTES_PER_PARAM / (dp if zero >= 1 else 1),
        activations=activations,
        comm_buffers=comm,
    )
