"""Fault injection: reproduce each collapse pattern on purpose (`--inject SPEC`, DESIGN.md).

    straggler:rank=R,ms=M             rank R sleeps M ms in each micro-batch's compute
    slow-comm:ms=M[,group=dp|tp|pp|ep] extra latency on every collective of that group (all if none)
    skew:frac=F[,expert=E]            the router sends ~F of the tokens to expert E (default 0)
    skew-growth:per_step=G            the skew fraction grows by G each step
    leak:mb=X                         retain X MB more every step (held by autograd)
    slowdown:ms=M[,rank=R]            compute slows by M ms more every step (rank R, or every rank)
    no-set-epoch                      the sampler is not re-seeded per epoch

`parse_injection` turns one spec into a typed frozen dataclass; `FaultPlan` answers, for one
rank, what the trainer must do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

GROUPS = ("dp", "tp", "pp", "ep")


@dataclass(frozen=True)
class Straggler:
    rank: int  # the slow rank
    ms: float  # sleep per micro-batch compute, milliseconds


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


Injection = Straggler | SlowComm | Skew | SkewGrowth | MemoryLeak | Slowdown | NoSetEpoch


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


# name -> (class, {key: (converter, required)})
_KINDS: dict[str, tuple[type, dict[str, tuple[Callable[[str], Any], bool]]]] = {
    "straggler": (Straggler, {"rank": (_nonneg_int, True), "ms": (_nonneg_float, True)}),
    "slow-comm": (SlowComm, {"ms": (_nonneg_float, True), "group": (_group, False)}),
    "skew": (Skew, {"frac": (_fraction, True), "expert": (_nonneg_int, False)}),
    "skew-growth": (SkewGrowth, {"per_step": (_fraction, True)}),
    "leak": (MemoryLeak, {"mb": (_nonneg_float, True)}),
    "slowdown": (Slowdown, {"ms": (_nonneg_float, True), "rank": (_nonneg_int, False)}),
    "no-set-epoch": (NoSetEpoch, {}),
}


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
    injection: Injection = cls(**values)
    return injection


@dataclass(frozen=True)
class FaultPlan:
    """What the injections ask of one rank. Empty plan = healthy run."""

    rank: int  # the rank this plan is for
    injections: tuple[Injection, ...] = ()  # parsed, in spec order
    specs: tuple[str, ...] = field(default=())  # the original strings, for the manifest

    @classmethod
    def from_specs(cls, specs: Sequence[str], rank: int) -> FaultPlan:
        injections = tuple(parse_injection(s) for s in specs)
        for kind in (Skew, SkewGrowth):
            if sum(isinstance(i, kind) for i in injections) > 1:
                given = [s for s, i in zip(specs, injections, strict=True) if isinstance(i, kind)]
                raise ValueError(f"at most one {kind.__name__} injection allowed, got {given}")
        return cls(rank=rank, injections=injections, specs=tuple(specs))

    def compute_delay_s(self, step: int = 0) -> float:
        """Sleep for this rank per micro-batch compute in step `step` (0 on healthy ranks)."""
        straggler_ms = sum(
            i.ms for i in self.injections if isinstance(i, Straggler) and i.rank == self.rank
        )
        slowdown_ms = sum(
            i.ms * step
            for i in self.injections
            if isinstance(i, Slowdown) and i.rank in (None, self.rank)
        )
        return (straggler_ms + slowdown_ms) / 1e3

    def comm_delay_s(self, group: str) -> float:
        """Extra latency for one collective of `group` (dp|tp|pp|ep|world)."""
        return sum(
            i.ms / 1e3
            for i in self.injections
            if isinstance(i, SlowComm) and i.group in (None, group)
        )

    def leak_bytes_per_step(self) -> int:
        return int(sum(i.mb for i in self.injections if isinstance(i, MemoryLeak)) * 2**20)

    @property
    def set_epoch(self) -> bool:
        """False under `no-set-epoch`: the trainer must not call sampler.set_epoch."""
        return not any(isinstance(i, NoSetEpoch) for i in self.injections)

    @property
    def skew(self) -> Skew | None:
        return next((i for i in self.injections if isinstance(i, Skew)), None)

    @property
    def skew_growth(self) -> SkewGrowth | None:
        return next((i for i in self.injections if isinstance(i, SkewGrowth)), None)

    def apply_compute_delay(self, step: int = 0) -> None:
        delay_s = self.compute_delay_s(step)
        if delay_s > 0:
            time.sleep(delay_s)


class Leak:
    """Retain `bytes_per_step` more bytes each `.step()`, held by autograd.

    The classic bug: keeping a loss together with its graph (`losses.append(loss)` instead of
    `loss.item()`). Each step makes a float32 leaf `x` of bytes_per_step // 4 elements and keeps
    `y = x.square().sum()`; the retained graph holds `x` as a tensor saved for backward. (`square`
    saves `x` once; `x * x` would save it twice, so a saved-tensor hook that does not
    de-duplicate storages would count it double.) Call `.step()` inside the forward span so the
    collectors' saved-tensor hooks attribute the bytes to activations.
    """

    def __init__(self, bytes_per_step: int, device: torch.device | str = "cpu") -> None:
        if bytes_per_step < 0:
            raise ValueError(f"bytes_per_step must be >= 0, got {bytes_per_step}")
        self.bytes_per_step = bytes_per_step
        self.device = torch.device(device)
        self._kept: list[torch.Tensor] = []
        self.retained_bytes = 0

    def step(self) -> None:
        numel = self.bytes_per_step // 4
        if numel == 0:
            return
        x = torch.ones(numel, dtype=torch.float32, device=self.device, requires_grad=True)
        self._kept.append(x.square().sum())
        self.retained_bytes += numel * 4
