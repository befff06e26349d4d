"""Fault injection specs: reproduce each collapse pattern on purpose (`--inject SPEC`,
docs/trainers.md).

    straggler:rank=R,ms=M[,from=S][,busy=1]
                                      rank R sleeps M ms in each micro-batch's compute (from
                                      step S on: a straggler that appears midway; default 0);
                                      busy=1: it computes them instead (keeps its core busy)
    slow-comm:ms=M[,group=dp|tp|pp|ep] extra latency on every collective of that group (all if none)
    skew:frac=F[,expert=E]            the router sends ~F of the tokens to expert E (default 0)
    skew-growth:per_step=G            the skew fraction grows by G each step
    leak:mb=X                         retain X MB more every step (held by autograd)
    slowdown:ms=M[,rank=R]            compute slows by M ms more every step (rank R, or every rank)
    no-set-epoch                      the sampler is not re-seeded per epoch
    stage-slow:stage=S,ms=M           every rank of pipeline stage S computes M ms more per
                                      micro-batch (stage 0 = every rank without a pipeline)
    jitter:ms=M                       each rank's compute of each step takes a random
                                      uniform [0, M] ms more (per seed, rank and step)
    loader-stall:rank=R,ms=M          rank R sleeps M ms fetching data before each step,
                                      outside the recorded step
    hang:rank=R,step=S                rank R sleeps forever before its forward of step S (a
                                      deadlock, a stuck loader): the others wait in its
                                      next collective until the process group times out
    crash:rank=R,step=S               rank R raises before its forward of step S
    desync:rank=R,step=S              rank R issues one collective the others do not (a
                                      1-element all-reduce on the world group) before its
                                      forward of step S: the collectives' order desynchronises
    kill:rank=R,step=S                rank R SIGKILLs itself before its forward of step S (no
                                      exception, no flush: a lost node)

The last four end the job: the reference trainers then use a short process-group timeout
(DIAG_PG_TIMEOUT_S, default 30 s with one of them). The simulator does not model them.

`parse_injection` turns one spec into a typed frozen dataclass; the functions below say what a
list of them asks of one rank, one group or one step. The reference trainers
(reference_runs/faults.py, which sleeps and leaks) and the simulator (simulator/injections.py,
which adds the same times to its clocks) both apply them through these. Pure Python, no torch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from diag.contract.names import PARALLEL_GROUPS

GROUPS = PARALLEL_GROUPS
"""The groups a `slow-comm` injection can name."""


@dataclass(frozen=True)
class Straggler:
    rank: int  # the slow rank
    ms: float  # sleep per micro-batch compute, milliseconds
    from_step: int = 0  # the first slow step (`from=S`): a straggler that appears midway
    busy: int = 0  # 1: the rank computes the M ms (a busy core) rather than sleeping them


@dataclass(frozen=True)
class SlowComm:
    ms: float  # extra latency per collective, milliseconds
    group: str | None = None  # dp|tp|pp|ep; None = every group


@dataclass(frozen=True)
class Skew:
    frac: float  # share of tokens routed to `expert`, in [0, 1]
    expert: int = 0  # the hot expert


@dataclass(frozen=True)
class SkewGrowth:
    per_step: float  # added to the skew fraction each step, in [0, 1]


@dataclass(frozen=True)
class MemoryLeak:
    mb: float  # MiB retained per step


@dataclass(frozen=True)
class Slowdown:
    """Compute that slows step after step (a throttling device, host-side work that grows)."""

    ms: float  # extra sleep per micro-batch compute added each step, milliseconds
    rank: int | None = None  # the slowing rank; None = every rank


@dataclass(frozen=True)
class NoSetEpoch:
    pass


@dataclass(frozen=True)
class StageSlow:
    """A heavier pipeline stage (more layers, the embedding or LM head, a slower device)."""

    stage: int  # the pipeline stage; 0 is every rank of a run without a pipeline
    ms: float  # extra sleep per micro-batch compute on each rank of the stage, milliseconds


@dataclass(frozen=True)
class Jitter:
    """Work that varies per batch (sequence lengths): the slowest rank changes every step."""

    ms: float  # the most extra compute per rank and step (uniform in [0, ms]), milliseconds


@dataclass(frozen=True)
class LoaderStall:
    """A slow data loader on one rank: time on the host, outside the recorded step."""

    rank: int  # the stalling rank
    ms: float  # sleep before each step, milliseconds


@dataclass(frozen=True)
class Hang:
    """A rank that stops taking part: it sleeps forever before its forward of `step`."""

    rank: int
    step: int


@dataclass(frozen=True)
class Crash:
    """A rank that raises before its forward of `step`."""

    rank: int
    step: int


@dataclass(frozen=True)
class Desync:
    """A rank that issues one collective the others do not, before its forward of `step`."""

    rank: int
    step: int


@dataclass(frozen=True)
class Kill:
    """A rank that SIGKILLs itself before its forward of `step`."""

    rank: int
    step: int


Failure = Hang | Crash | Desync | Kill
"""The injections that end the job."""

Injection = (
    Straggler | SlowComm | Skew | SkewGrowth | MemoryLeak | Slowdown | NoSetEpoch | StageSlow
    | Jitter | LoaderStall | Hang | Crash | Desync | Kill
)  # fmt: skip


def _as_number(v: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(v)
    except ValueError:
        raise ValueError(f"is not {'an integer' if kind is int else 'a number'}") from None


def _nonneg_int(v: str) -> int:
    n = int(_as_number(v, int))
    if n < 0:
        raise ValueError("must be >= 0")
    return n


def _nonneg_float(v: str) -> float:
    x = _as_number(v, float)
    if not 0 <= x < float("inf"):  # also rejects nan
        raise ValueError("must be a finite number >= 0")
    return x


def _fraction(v: str) -> float:
    x = _as_number(v, float)
    if not 0.0 <= x <= 1.0:
        raise ValueError("must be in [0, 1]")
    return x


def _group(v: str) -> str:
    if v not in GROUPS:
        raise ValueError(f"must be one of {'|'.join(GROUPS)}")
    return v


def _flag(v: str) -> int:
    if v not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return int(v)


# name -> (class, {key: (converter, required)})
_KINDS: dict[str, tuple[type, dict[str, tuple[Callable[[str], Any], bool]]]] = {
    "straggler": (
        Straggler,
        {
            "rank": (_nonneg_int, True),
            "ms": (_nonneg_float, True),
            "from": (_nonneg_int, False),
            "busy": (_flag, False),
        },
    ),
    "slow-comm": (SlowComm, {"ms": (_nonneg_float, True), "group": (_group, False)}),
    "skew": (Skew, {"frac": (_fraction, True), "expert": (_nonneg_int, False)}),
    "skew-growth": (SkewGrowth, {"per_step": (_fraction, True)}),
    "leak": (MemoryLeak, {"mb": (_nonneg_float, True)}),
    "slowdown": (Slowdown, {"ms": (_nonneg_float, True), "rank": (_nonneg_int, False)}),
    "no-set-epoch": (NoSetEpoch, {}),
    "stage-slow": (StageSlow, {"stage": (_nonneg_int, True), "ms": (_nonneg_float, True)}),
    "jitter": (Jitter, {"ms": (_nonneg_float, True)}),
    "loader-stall": (LoaderStall, {"rank": (_nonneg_int, True), "ms": (_nonneg_float, True)}),
    "hang": (Hang, {"rank": (_nonneg_int, True), "step": (_nonneg_int, True)}),
    "crash": (Crash, {"rank": (_nonneg_int, True), "step": (_nonneg_int, True)}),
    "desync": (Desync, {"rank": (_nonneg_int, True), "step": (_nonneg_int, True)}),
    "kill": (Kill, {"rank": (_nonneg_int, True), "step": (_nonneg_int, True)}),
}


_FIELDS = {"from": "from_step"}
"""Spec keys whose field is named otherwise (`from` is a Python keyword)."""


def parse_injection(spec: str) -> Injection:
    """Parse one `--inject` spec; ValueError with a one-line message quoting the spec."""

    def fail(reason: str) -> ValueError:
        return ValueError(f"bad injection {spec!r}: {reason}")

    name, _, rest = spec.strip().partition(":")
    if name not in _KINDS:
        raise fail(f"unknown injection {name!r}; expected one of {', '.join(_KINDS)}")
    cls, schema = _KINDS[name]
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not raw:
            raise fail(f"expected key=value, got {item!r}")
        if key not in schema:
            allowed = ", ".join(schema) or "none"
            raise fail(f"unknown key {key!r} for {name} (allowed: {allowed})")
        if key in values:
            raise fail(f"key {key!r} given twice")
        try:
            values[key] = schema[key][0](raw)
        except ValueError as exc:
            raise fail(f"{key}={raw!r} {exc}") from None
    missing = [key for key, (_, required) in schema.items() if required and key not in values]
    if missing:
        raise fail(f"missing required key(s) {', '.join(missing)}")
    injection: Injection = cls(**{_FIELDS.get(key, key): value for key, value in values.items()})
    return injection


# --- What the injections ask for -----------------------------------------------------------------
# Sums run in spec order from 0.0, so the trainers and the simulator add the same floats.


def straggler_ms(injections: Sequence[Injection], rank: int, step: int | None = None) -> float:
    """Extra compute of `rank` per micro-batch in step `step` (ms); without a step, that of the
    stragglers slow from the first step (in every step)."""
    return sum(
        (
            i.ms
            for i in injections
            if isinstance(i, Straggler)
            and i.rank == rank
            and (i.from_step == 0 if step is None else i.from_step <= step)
        ),
        0.0,
    )


def busy_straggler_ms(injections: Sequence[Injection], rank: int, step: int) -> float:
    """The part of `straggler_ms(injections, rank, step)` the rank computes (`busy=1`) rather
    than sleeps (ms)."""
    return sum(
        (
            i.ms
            for i in injections
            if isinstance(i, Straggler) and i.busy and i.rank == rank and i.from_step <= step
        ),
        0.0,
    )


def slowdown_ms(injections: Sequence[Injection], rank: int) -> float:
    """Extra compute of `rank` per micro-batch added each step (ms): `step` times this in
    step `step`."""
    return sum(
        (i.ms for i in injections if isinstance(i, Slowdown) and i.rank in (None, rank)), 0.0
    )


def stage_slow_ms(injections: Sequence[Injection], stage: int) -> float:
    """Extra compute per micro-batch of every rank of pipeline stage `stage` (ms; a run
    without a pipeline is stage 0)."""
    return sum((i.ms for i in injections if isinstance(i, StageSlow) and i.stage == stage), 0.0)


def compute_delay_ms(
    injections: Sequence[Injection], rank: int, step: int, stage: int = 0
) -> float:
    """Extra compute of `rank` (of pipeline stage `stage`) per micro-batch in step `step` (ms;
    0 on healthy ranks)."""
    return (
        straggler_ms(injections, rank, step)
        + slowdown_ms(injections, rank) * step
        + stage_slow_ms(injections, stage)
    )


def jitter_ms(injections: Sequence[Injection], rank: int, step: int, seed: int = 0) -> float:
    """Extra compute of `rank` in step `step`, once per step (ms): for each `jitter:ms=M`, a
    uniform draw in [0, M] that depends only on (seed, rank, step, the injection's place), so
    the trainers and the simulator draw the same delays and every run of a seed repeats them."""
    total = 0.0
    for index, i in enumerate(injections):
        if isinstance(i, Jitter) and i.ms > 0:
            draw = random.Random(f"jitter:{seed}:{index}:{rank}:{step}").random()
            total += draw * i.ms
    return total


def loader_stall_ms(injections: Sequence[Injection], rank: int) -> float:
    """Time `rank` spends fetching data before each step, outside the recorded step (ms)."""
    return sum((i.ms for i in injections if isinstance(i, LoaderStall) and i.rank == rank), 0.0)


def comm_delay_ms(injections: Sequence[Injection], group: str) -> float:
    """Extra latency of one collective of `group` (dp|tp|pp|ep|world), ms."""
    return sum(
        (i.ms for i in injections if isinstance(i, SlowComm) and i.group in (None, group)), 0.0
    )


def leak_bytes_per_step(injections: Sequence[Injection]) -> int:
    """Bytes retained more every step (`leak:mb=X`, MiB)."""
    return int(sum((i.mb for i in injections if isinstance(i, MemoryLeak)), 0.0) * 2**20)


def sets_epoch(injections: Sequence[Injection]) -> bool:
    """False under `no-set-epoch`: the sampler must not be re-seeded per epoch."""
    return not any(isinstance(i, NoSetEpoch) for i in injections)


def skew_at(
    skew: Skew | None, growth: SkewGrowth | None, step: int, experts: int
) -> tuple[int, float] | None:
    """(hot expert, share of first choices sent to it) at `step`, None when routing is healthy.
    `skew:frac=F` gives F; `skew-growth:per_step=G` adds G x step to F (to 1/experts, the
    balanced share, without a skew), capped at 1."""
    if skew is None and growth is None:
        return None
    frac = skew.frac if skew is not None else 1 / experts
    if growth is not None:
        frac += growth.per_step * step
    return (skew.expert if skew is not None else 0), min(frac, 1.0)


def failure_at(injections: Sequence[Injection], rank: int, step: int) -> Failure | None:
    """The failure `rank` must perform before its forward of `step` (the first given), if any."""
    for i in injections:
        if isinstance(i, (Hang, Crash, Desync, Kill)) and i.rank == rank and i.step == step:
            return i
    return None


def ends_job(injections: Sequence[Injection]) -> bool:
    """Whether some injection ends the job (a hang, crash, desync or kill)."""
    return any(isinstance(i, (Hang, Crash, Desync, Kill)) for i in injections)
