"""The `--inject` specs of `diag run` (diag/contract/injections.py), as the simulator applies them.

    straggler:rank=R,ms=M[,from=S]    rank R computes M ms longer in each micro-batch's forward
                                      (from step S on; default 0)
    slow-comm:ms=M[,group=dp|tp|pp|ep] M ms more on every collective of that group (all if none)
    skew:frac=F[,expert=E]            expert E is the first choice of a share F of the tokens
    skew-growth:per_step=G            that share grows by G each step (from 1/experts without skew)
    leak:mb=X                         X MiB more activations held every step
    slowdown:ms=M[,rank=R]            compute M ms longer per micro-batch, more every step
    no-set-epoch                      every epoch reads its samples in the same order
    stage-slow:stage=S,ms=M           every rank of stage S computes M ms longer in each forward
    jitter:ms=M                       each rank's first forward of a step takes a uniform
                                      [0, M] ms longer (drawn per seed, rank and step)
    loader-stall:rank=R,ms=M          rank R starts each step M ms late (no span covers the gap)

The specs are parsed, and their delays, skew and leak added up, by diag/contract/injections.py, as
the reference trainers do (same syntax, same messages, same sums); here they are checked against the
simulated run and laid out over the rank grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from diag.contract import injections as inj
from diag.contract.injections import Jitter, Skew, SkewGrowth, StageSlow, Straggler
from simulator.config import SimConfig


@dataclass(frozen=True)
class Faults:
    """The injections of one run, vectorised over the rank grid."""

    specs: tuple[str, ...]
    straggler_ms: np.ndarray  # (world,) extra ms per micro-batch forward (from step 0)
    slowdown_ms: np.ndarray  # (world,) extra ms per micro-batch forward, times the step index
    comm_ms: dict[str, float]  # group -> extra ms per collective
    skew: Skew | None
    skew_growth: SkewGrowth | None
    leak_bytes_per_step: int
    set_epoch: bool
    stage_ms: np.ndarray | None = None  # (world,) extra ms per micro-batch forward (stage-slow)
    loader_stall_ms: np.ndarray | None = None  # (world,) ms late at the start of every step
    jitter: tuple[inj.Injection, ...] = ()  # the parsed specs when one is a `jitter`, else ()
    seed: int = 0  # the run's seed, which the jitter draws depend on
    late_stragglers: tuple[Straggler, ...] = ()  # stragglers from a later step (`from=S`)

    def compute_delay_ns(self, step: int) -> np.ndarray:
        """(world,) ns each rank's forward of one micro-batch takes longer at `step`."""
        ms = self.straggler_ms + self.slowdown_ms * step
        if self.stage_ms is not None:
            ms = ms + self.stage_ms
        for late in self.late_stragglers:
            if step >= late.from_step:
                ms[late.rank] += late.ms
        return ms * 1e6

    def jitter_ns(self, step: int) -> np.ndarray | None:
        """(world,) ns each rank's first forward of `step` takes longer, None without jitter (the
        draws of diag.contract.injections.jitter_ms, as the trainers sleep them)."""
        if not self.jitter:
            return None
        world = len(self.straggler_ms)
        ms = [inj.jitter_ms(self.jitter, rank, step, self.seed) for rank in range(world)]
        return np.array(ms) * 1e6

    def comm_delay_ns(self, group: str) -> float:
        return self.comm_ms.get(group, 0.0) * 1e6

    def skew_at(self, step: int, experts: int) -> tuple[int, float] | None:
        """(hot expert, share of first choices) at `step`, None when routing is healthy."""
        return inj.skew_at(self.skew, self.skew_growth, step, experts)


def no_faults(world: int) -> Faults:
    zeros = np.zeros(world)
    return Faults((), zeros, zeros.copy(), {}, None, None, 0, True)


def parse_faults(
    specs: Sequence[str], world: int, experts: int, stages: np.ndarray | None = None,
    seed: int = 0,
) -> Faults:  # fmt: skip
    """Faults of `specs` (`stages`: the (world,) pipeline stage of each rank, all 0 if None;
    `seed`: the run's); ValueError (one line, quoting the spec) on a bad or impossible one."""
    if not specs:
        return no_faults(world)
    stage_of = np.zeros(world, dtype=int) if stages is None else np.asarray(stages)
    num_stages = int(stage_of.max()) + 1
    parsed = [inj.parse_injection(spec) for spec in specs]
    skew: Skew | None = None
    growth: SkewGrowth | None = None
    for spec, injection in zip(specs, parsed, strict=True):
        if isinstance(injection, inj.Hang | inj.Crash | inj.Desync | inj.Kill):
            raise ValueError(f"bad injection {spec!r}: the simulator does not model a job that "
                             "fails; run a reference trainer (diag run) to inject it")  # fmt: skip
        rank = getattr(injection, "rank", None)
        if rank is not None and not 0 <= rank < world:
            raise ValueError(f"bad injection {spec!r}: rank {rank} is not in 0..{world - 1}")
        if isinstance(injection, StageSlow) and injection.stage >= num_stages:
            raise ValueError(
                f"bad injection {spec!r}: stage {injection.stage} is not in 0..{num_stages - 1}"
            )
        if isinstance(injection, Skew | SkewGrowth) and not experts:
            raise ValueError(f"bad injection {spec!r}: needs a MoE model (--experts > 0)")
        if isinstance(injection, Skew):
            if skew is not None:
                raise ValueError(f"at most one skew injection allowed, got {spec!r} again")
            if injection.expert >= experts:
                raise ValueError(
                    f"bad injection {spec!r}: expert {injection.expert} >= experts ({experts})"
                )
            skew = injection
        elif isinstance(injection, SkewGrowth):
            if growth is not None:
                raise ValueError(f"at most one skew-growth injection allowed, got {spec!r}")
            growth = injection
    return Faults(
        specs=tuple(specs),
        straggler_ms=_per_rank(inj.straggler_ms, parsed, world),
        slowdown_ms=_per_rank(inj.slowdown_ms, parsed, world),
        comm_ms={group: inj.comm_delay_ms(parsed, group) for group in inj.GROUPS},
        skew=skew,
        skew_growth=growth,
        leak_bytes_per_step=inj.leak_bytes_per_step(parsed),
        set_epoch=inj.sets_epoch(parsed),
        stage_ms=np.array([inj.stage_slow_ms(parsed, int(st)) for st in stage_of]),
        loader_stall_ms=_per_rank(inj.loader_stall_ms, parsed, world),
        jitter=tuple(parsed) if any(isinstance(i, Jitter) for i in parsed) else (),
        seed=seed,
        late_stragglers=tuple(i for i in parsed if isinstance(i, Straggler) and i.from_step > 0),
    )


def _per_rank(
    ms_of: Callable[[Sequence[inj.Injection], int], float], parsed: list[inj.Injection], world: int
) -> np.ndarray:
    """(world,) `ms_of(parsed, rank)` of every rank: the ranks no injection names share one
    value (an injection without a rank applies to all of them)."""
    named = {r for i in parsed if (r := getattr(i, "rank", None)) is not None}
    unnamed = next((r for r in range(world) if r not in named), None)
    out = np.full(world, ms_of(parsed, unnamed) if unnamed is not None else 0.0)
    for rank in named:
        out[rank] = ms_of(parsed, rank)
    return out


def stage_of_ranks(config: SimConfig) -> np.ndarray:
    """(world,) the pipeline stage of each rank of the grid (dp, pp, ep, tp)."""
    shape = (config.dp, config.pp, config.ep, config.tp)
    return np.broadcast_to(np.arange(config.pp)[None, :, None, None], shape).reshape(-1)
