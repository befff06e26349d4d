"""The `--inject` specs of `diag run` (reference_runs/faults.py), as the simulator applies them.

    straggler:rank=R,ms=M             rank R computes M ms longer in each micro-batch's forward
    slow-comm:ms=M[,group=dp|tp|pp|ep] M ms more on every collective of that group (all if none)
    skew:frac=F[,expert=E]            expert E is the first choice of a share F of the tokens
    skew-growth:per_step=G            that share grows by G each step (from 1/experts without skew)
    leak:mb=X                         X MiB more activations held every step
    slowdown:ms=M[,rank=R]            compute M ms longer per micro-batch, more every step
    no-set-epoch                      every epoch reads its samples in the same order

The specs are parsed by `reference_runs.faults.parse_injection` (same syntax, same messages);
that module imports torch, so it is imported only when a run has injections.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Faults:
    """The injections of one run, vectorised over the rank grid."""

    specs: tuple[str, ...]
    straggler_ms: np.ndarray  # (world,) extra ms per micro-batch forward
    slowdown_ms: np.ndarray  # (world,) extra ms per micro-batch forward, times the step index
    comm_ms: dict[str, float]  # group -> extra ms per collective
    skew: tuple[int, float] | None  # (hot expert, first-choice share) of `skew`
    skew_growth: float | None  # share added per step
    leak_bytes_per_step: int
    set_epoch: bool

    def compute_delay_ns(self, step: int) -> np.ndarray:
        """(world,) ns each rank's forward of one micro-batch takes longer at `step`."""
        return (self.straggler_ms + self.slowdown_ms * step) * 1e6

    def comm_delay_ns(self, group: str) -> float:
        return self.comm_ms.get(group, 0.0) * 1e6

    def skew_at(self, step: int, experts: int) -> tuple[int, float] | None:
        """(hot expert, share of first choices) at `step`, None when routing is healthy; the
        ep trainer's rule (reference_runs/ep.py `skew_at`)."""
        if self.skew is None and self.skew_growth is None:
            return None
        hot, frac = self.skew if self.skew is not None else (0, 1 / experts)
        if self.skew_growth is not None:
            frac += self.skew_growth * step
        return hot, min(frac, 1.0)


def no_faults(world: int) -> Faults:
    zeros = np.zeros(world)
    return Faults((), zeros, zeros.copy(), {}, None, None, 0, True)


def parse_faults(specs: Sequence[str], world: int, experts: int) -> Faults:
    """Faults of `specs`; ValueError (one line, quoting the spec) on a bad or impossible one."""
    if not specs:
        return no_faults(world)
    from reference_runs import faults as rf  # imports torch: only for runs with injections

    parsed: list[Any] = []
    for spec in specs:
        parsed.append(rf.parse_injection(spec))
    straggler = np.zeros(world)
    slowdown = np.zeros(world)
    comm: dict[str, float] = {}
    skew: tuple[int, float] | None = None
    growth: float | None = None
    leak = 0.0
    set_epoch = True
    for spec, inj in zip(specs, parsed, strict=True):
        rank = getattr(inj, "rank", None)
        if rank is not None and not 0 <= rank < world:
            raise ValueError(f"bad injection {spec!r}: rank {rank} is not in 0..{world - 1}")
        if isinstance(inj, rf.Straggler):
            straggler[inj.rank] += inj.ms
        elif isinstance(inj, rf.Slowdown):
            if inj.rank is None:
                slowdown += inj.ms
            else:
                slowdown[inj.rank] += inj.ms
        elif isinstance(inj, rf.SlowComm):
            for group in (inj.group,) if inj.group else rf.GROUPS:
                comm[group] = comm.get(group, 0.0) + inj.ms
        elif isinstance(inj, rf.Skew | rf.SkewGrowth):
            if not experts:
                raise ValueError(f"bad injection {spec!r}: needs a MoE model (--experts > 0)")
            if isinstance(inj, rf.Skew):
                if skew is not None:
                    raise ValueError(f"at most one skew injection allowed, got {spec!r} again")
                if inj.expert >= experts:
                    raise ValueError(
                        f"bad injection {spec!r}: expert {inj.expert} >= experts ({experts})"
                    )
                skew = (inj.expert, inj.frac)
            else:
                if growth is not None:
                    raise ValueError(f"at most one skew-growth injection allowed, got {spec!r}")
                growth = inj.per_step
        elif isinstance(inj, rf.MemoryLeak):
            leak += inj.mb
        elif isinstance(inj, rf.NoSetEpoch):
            set_epoch = False
    return Faults(
        tuple(specs), straggler, slowdown, comm, skew, growth, int(leak * 2**20), set_epoch
    )
