"""Fault injection in the reference trainers: what the `--inject` specs ask of one rank, and
the memory leak they can hold.

The specs, their parsing and what they add up to are diag/contract/injections.py (shared with the
simulator, torch-free); `FaultPlan` answers, for one rank, what the trainer must do, and sleeps
where it must; `Leak` retains the tensors of `leak:mb=X`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from diag.contract import injections as inj
from diag.contract.injections import (
    Crash,
    Desync,
    Hang,
    Injection,
    Kill,
    Skew,
    SkewGrowth,
    parse_injection,
)

PG_TIMEOUT_ENV = "DIAG_PG_TIMEOUT_S"
"""The process groups' timeout in seconds (the trainers' `init_process_group` and
`new_group`); unset: torch's default, or FAILURE_PG_TIMEOUT_S under a failure injection."""
FAILURE_PG_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class FaultPlan:
    """What the injections ask of one rank. Empty plan = healthy run."""

    rank: int  # the rank this plan is for
    injections: tuple[Injection, ...] = ()  # parsed, in spec order
    specs: tuple[str, ...] = field(default=())  # the original strings, for the manifest
    stage: int = 0  # the rank's pipeline stage (0 without a pipeline), for `stage-slow`
    seed: int = 0  # the run's seed, which the `jitter` draws depend on
    _jittered: set[int] = field(default_factory=set, compare=False, repr=False)
    """Steps whose `jitter` delay was slept already (once per step, at its first compute)."""
    _failed: set[int] = field(default_factory=set, compare=False, repr=False)
    """Steps whose failure injection ran already (a desync issues its collective once)."""

    @classmethod
    def from_specs(
        cls, specs: Sequence[str], rank: int, stage: int = 0, seed: int = 0
    ) -> FaultPlan:
        injections = tuple(parse_injection(s) for s in specs)
        for kind in (Skew, SkewGrowth):
            if sum(isinstance(i, kind) for i in injections) > 1:
                given = [s for s, i in zip(specs, injections, strict=True) if isinstance(i, kind)]
                raise ValueError(f"at most one {kind.__name__} injection allowed, got {given}")
        return cls(rank=rank, injections=injections, specs=tuple(specs), stage=stage, seed=seed)

    def compute_delay_s(self, step: int = 0) -> float:
        """Sleep for this rank per micro-batch compute in step `step` (0 on healthy ranks)."""
        return inj.compute_delay_ms(self.injections, self.rank, step, self.stage) / 1e3

    def jitter_s(self, step: int = 0) -> float:
        """This rank's `jitter` delay in step `step`, slept once in that step's compute."""
        return inj.jitter_ms(self.injections, self.rank, step, self.seed) / 1e3

    def loader_stall_s(self) -> float:
        """Sleep for this rank in its data fetch before each step, outside the recorded step."""
        return inj.loader_stall_ms(self.injections, self.rank) / 1e3

    def comm_delay_s(self, group: str) -> float:
        """Extra latency for one collective of `group` (dp|tp|pp|ep|world)."""
        return inj.comm_delay_ms(self.injections, group) / 1e3

    def leak_bytes_per_step(self) -> int:
        return inj.leak_bytes_per_step(self.injections)

    @property
    def set_epoch(self) -> bool:
        """False under `no-set-epoch`: the trainer must not call sampler.set_epoch."""
        return inj.sets_epoch(self.injections)

    @property
    def skew(self) -> Skew | None:
        return next((i for i in self.injections if isinstance(i, Skew)), None)

    @property
    def skew_growth(self) -> SkewGrowth | None:
        return next((i for i in self.injections if isinstance(i, SkewGrowth)), None)

    def skew_at(self, step: int, num_experts: int) -> tuple[int, float] | None:
        """(hot expert, share of first choices sent to it) at `step`, None when healthy."""
        return inj.skew_at(self.skew, self.skew_growth, step, num_experts)

    def leak(self, device: torch.device | str = "cpu") -> Leak | None:
        """The `Leak` of `leak:mb=X` on `device`, None without one."""
        nbytes = self.leak_bytes_per_step()
        return Leak(nbytes, device) if nbytes else None

    def apply_compute_delay(self, step: int = 0) -> None:
        """Sleep this micro-batch's extra compute (compute the part a `busy=1` straggler asks
        for, on the CPU); the first call of a step adds its jitter."""
        delay_s = self.compute_delay_s(step)
        busy_s = min(inj.busy_straggler_ms(self.injections, self.rank, step) / 1e3, delay_s)
        if step not in self._jittered:
            self._jittered.add(step)
            delay_s += self.jitter_s(step)
        if busy_s > 0:
            _spin(busy_s)
        if delay_s - busy_s > 0:
            time.sleep(delay_s - busy_s)

    def pg_timeout_s(self) -> float | None:
        """The process groups' timeout: DIAG_PG_TIMEOUT_S, else FAILURE_PG_TIMEOUT_S when an
        injection ends the job (so it ends in seconds, not torch's 30 minutes), else None."""
        raw = os.environ.get(PG_TIMEOUT_ENV, "").strip()
        if raw:
            value = float(raw)
            if not 0 < value < float("inf"):
                raise ValueError(f"{PG_TIMEOUT_ENV}={raw!r} must be a number of seconds > 0")
            return value
        return FAILURE_PG_TIMEOUT_S if inj.ends_job(self.injections) else None

    def apply_failure(self, step: int, rec: Any = None) -> None:
        """The hang, crash, desync or kill this rank must perform at `step`, once, before its
        first forward of the step (call it inside the `fwd` span, before the compute delay).
        A desync's extra collective is recorded through `rec` (a Recorder) when given."""
        failure = inj.failure_at(self.injections, self.rank, step)
        if failure is None or step in self._failed:
            return
        self._failed.add(step)
        where = f"rank {self.rank} at step {step}"
        if isinstance(failure, Hang):
            while True:  # never returns: the others wait for it until their timeout
                time.sleep(3600)
        if isinstance(failure, Crash):
            raise RuntimeError(f"injected crash: {where}")
        if isinstance(failure, Kill):
            os.kill(os.getpid(), signal.SIGKILL)
        if isinstance(failure, Desync):
            extra = torch.zeros(1)  # gloo and the CPU: a collective no other rank issues
            if torch.cuda.is_available() and dist.get_backend() == "nccl":
                extra = extra.cuda()
            recorded = (
                rec.collective("all_reduce", 4, None, dtype="float32", tag="inject.desync")
                if rec is not None
                else contextlib.nullcontext()
            )
            with recorded:
                if rec is not None:
                    # gloo aborts a rank whose collective's size differs from its peers' (NCCL
                    # would hang): its record as issued must be on disk before it is launched
                    rec.flush()
                dist.all_reduce(extra)

    def apply_loader_stall(self) -> None:
        """Sleep the `loader-stall` of this rank; call it before the step's `rec.step` opens."""
        delay_s = self.loader_stall_s()
        if delay_s > 0:
            time.sleep(delay_s)


def _spin(seconds: float) -> None:
    """Keep this thread's core busy for `seconds` of wall time (compute, as CPU time sees it:
    the training thread's CPU time grows with it, a sleep's does not)."""
    until = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < until:
        for _ in range(1000):
            x = (x * 31 + 7) % 1_000_003


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
