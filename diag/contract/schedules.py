"""Pipeline schedules as pure functions: the (fwd|bwd, micro-batch, chunk) actions of each stage.

- GPipe (Huang et al. 2019, arXiv 1811.06965): all m forwards, then all m backwards. Every
  stage holds the activations of all m micro-batches at once.
- 1F1B, PipeDream-Flush (Narayanan et al. 2021, arXiv 2006.09503): stage s runs p-s-1 warm-up
  forwards, then alternates one forward and one backward, then drains the remaining backwards.
  At most p-s micro-batches are in flight on stage s, whatever m.
- Interleaved 1F1B (Narayanan et al. 2021, arXiv 2104.04473, Megatron-LM): each rank holds v
  model chunks (rank s holds model stages s, s+p, ..., s+(v-1)p) and walks them in groups of p
  micro-batches, which divides the bubble time by v (needs m divisible by p).

All three share one shape (`_interleave`): `# Warmup` forwards, `# Steady 1F1B`, `# Cooldown`.
`simulate` replays the orders with fixed forward/backward times and free communication: every
stage's bubble is then exactly the ledger's (p-1)/(v·m+p-1). Pure Python, no torch: the pipeline
trainer (reference_runs/pp.py) and the simulator (simulator/engine.py) run the same orders.
"""

from __future__ import annotations

from typing import NamedTuple

from diag.contract.names import SCHEDULES


class Action(NamedTuple):
    kind: str  # "fwd" or "bwd"
    mb: int  # micro-batch index
    chunk: int  # model chunk on this rank (0 unless interleaved)


def check_layout(
    schedule: str, layers: int, stages: int, microbatches: int, chunks: int = 1
) -> None:
    """ValueError naming the numbers when the pipeline cannot be built."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if min(layers, stages, microbatches, chunks) < 1:
        raise ValueError(
            f"layers, stages, microbatches and virtual stages must be >= 1, got "
            f"{layers}, {stages}, {microbatches}, {chunks}"
        )
    if chunks > 1 and schedule != "interleaved":
        raise ValueError(f"--virtual-stages {chunks} needs --schedule interleaved")
    if layers % (stages * chunks) != 0:
        raise ValueError(
            f"--layers ({layers}) must be divisible by --pp ({stages}) x --virtual-stages "
            f"({chunks}) = {stages * chunks}"
        )
    if schedule == "interleaved" and microbatches % stages != 0:
        raise ValueError(
            f"interleaved 1F1B needs --microbatches ({microbatches}) divisible by --pp ({stages})"
        )


def split_layers(layers: int, stages: int, chunks: int = 1) -> list[range]:
    """Block indices of each model stage k = chunk * stages + stage, equal-sized."""
    parts = stages * chunks
    if layers % parts != 0:
        raise ValueError(
            f"--layers ({layers}) must be divisible by --pp ({stages}) x --virtual-stages "
            f"({chunks}) = {parts}"
        )
    per = layers // parts
    return [range(k * per, (k + 1) * per) for k in range(parts)]


def model_stage(stage: int, chunk: int, stages: int) -> int:
    """Position in the whole model of chunk `chunk` of pipeline rank `stage` (Megatron order)."""
    return chunk * stages + stage


def warmup_forwards(
    schedule: str, stage: int, stages: int, microbatches: int, chunks: int = 1
) -> int:
    """Forwards stage `stage` runs before its first backward."""
    total = microbatches * chunks
    if schedule == "gpipe":
        return total
    if schedule == "1f1b":
        return min(stages - stage - 1, total)
    # Megatron: two per later stage (the forward and the backward must both cross it), plus
    # one full round of p for every extra chunk.
    return min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)


def _virtual(k: int, stages: int, chunks: int, backward: bool) -> Action:
    """The k-th forward (or backward) of an interleaved rank: p micro-batches per chunk in turn."""
    group, pos = divmod(k, stages * chunks)
    chunk = pos // stages
    mb = group * stages + pos % stages
    return Action("bwd" if backward else "fwd", mb, chunks - 1 - chunk if backward else chunk)


def schedule_order(
    schedule: str, stage: int, stages: int, microbatches: int, chunks: int = 1
) -> list[Action]:
    """The actions of pipeline rank `stage`, in the order it runs them."""
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in [0, {stages}), got {stage}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if schedule == "interleaved":
        if microbatches % stages != 0:
            raise ValueError(
                f"interleaved 1F1B needs microbatches ({microbatches}) divisible by stages "
                f"({stages})"
            )
        total = microbatches * chunks
        fwds = [_virtual(k, stages, chunks, backward=False) for k in range(total)]
        bwds = [_virtual(k, stages, chunks, backward=True) for k in range(total)]
    else:
        if chunks != 1:
            raise ValueError(f"{schedule} runs one chunk per stage, got {chunks}")
        fwds = [Action("fwd", mb, 0) for mb in range(microbatches)]
        bwds = [Action("bwd", mb, 0) for mb in range(microbatches)]
    warmup = warmup_forwards(schedule, stage, stages, microbatches, chunks)
    return _interleave(fwds, bwds, warmup)


def _interleave(fwds: list[Action], bwds: list[Action], warmup: int) -> list[Action]:
    order: list[Action] = []
    # Warmup: forwards only, filling the pipeline
    order += fwds[:warmup]
    # Steady 1F1B: one forward, then the oldest backward
    for i in range(len(fwds) - warmup):
        order += [fwds[warmup + i], bwds[i]]
    # Cooldown: the backwards still owed, draining the pipeline
    order += bwds[len(fwds) - warmup :]
    return order


def peak_in_flight(order: list[Action]) -> int:
    """Most forwards without their backward yet in a stage's order (chunks count apart): the
    micro-batches whose activations the stage holds at once."""
    live = peak = 0
    for action in order:
        live += 1 if action.kind == "fwd" else -1
        peak = max(peak, live)
    return peak


class Simulation(NamedTuple):
    makespan: float  # time from the first action to the last
    busy: list[float]  # compute time of each stage
    peak_in_flight: list[int]  # most forwards without their backward yet, per stage

    def bubble(self, stage: int) -> float:
        return 1 - self.busy[stage] / self.makespan


def simulate(
    schedule: str,
    stages: int,
    microbatches: int,
    chunks: int = 1,
    fwd_time: float = 1.0,
    bwd_time: float = 2.0,
) -> Simulation:
    """Replay the schedule's orders (`replay`) with fixed forward and backward times."""
    orders = [schedule_order(schedule, s, stages, microbatches, chunks) for s in range(stages)]
    return replay(orders, chunks, fwd_time, bwd_time)


def replay(
    orders: list[list[Action]], chunks: int = 1, fwd_time: float = 1.0, bwd_time: float = 2.0
) -> Simulation:
    """Run every stage's order with fixed times per micro-batch (a chunk takes 1/chunks of them)
    and free communication. A forward of model stage k waits for the forward of k-1, a backward
    of k for the backward of k+1; a stage runs its actions in order, as the trainer does (async
    sends, blocking receives). RuntimeError if the orders deadlock."""
    stages = len(orders)
    last = stages * chunks - 1
    done: dict[tuple[str, int, int], float] = {}  # (kind, model stage, mb) -> finish time
    clock = [0.0] * stages
    nxt = [0] * stages
    busy = [0.0] * stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(stages):
            if nxt[s] == len(orders[s]):
                continue
            action = orders[s][nxt[s]]
            k = model_stage(s, action.chunk, stages)
            if action.kind == "fwd":
                dep = ("fwd", k - 1, action.mb) if k > 0 else None
            else:
                dep = ("bwd", k + 1, action.mb) if k < last else ("fwd", k, action.mb)
            if dep is not None and dep not in done:
                continue
            cost = (fwd_time if action.kind == "fwd" else bwd_time) / chunks
            start = max(clock[s], done[dep] if dep is not None else 0.0)
            clock[s] = start + cost
            done[(action.kind, k, action.mb)] = clock[s]
            busy[s] += cost
            nxt[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise RuntimeError(f"the orders deadlock: next actions {nxt} of each stage")
    return Simulation(max(clock), busy, [peak_in_flight(order) for order in orders])
