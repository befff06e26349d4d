"""What a Recorder's step and span contexts (collectors/contexts.py) share with it: the writer
and samplers it built (`RecorderParts`), and the public face they read (`StepOwner`). The
contexts reach the recorder through these two only, so neither module imports the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from collectors.clock import Clock
from collectors.comm import CommEvent
from collectors.device import CudaSpanTimer, NvmlSampler
from collectors.host import HostSampler
from collectors.inflight import InFlight
from collectors.memory import SavedTensorTracker
from collectors.writer import RankWriter


@dataclass
class RecorderParts:
    """The recorder's writer and samplers (set once, when it is built) and the few values a
    step carries from one context to the next (set while the step runs)."""

    writer: RankWriter
    host: HostSampler
    nvml: NvmlSampler | None
    cuda_timer: CudaSpanTimer | None
    activations: SavedTensorTracker | None
    """Measures saved activations on the steps that sample them; None when not tracked."""
    params: list[torch.Tensor] | None = None
    """The watched model's parameters, listed once (`Recorder.watch`)."""
    step_end_callbacks: list[Callable[[], None]] = field(default_factory=list)
    measuring_activations: bool = False
    """Whether this step samples activations (the first 3 steps and every
    `activation_every`-th after)."""
    grads_at_opt_bytes: int | None = None
    """The gradients' bytes when the step's optimizer span opened (their peak)."""
    fetch_t0: int | None = None
    """Where the last `iterate` fetch began: the step that follows starts there, so a slow
    loader is its rank's time inside the step, not time between steps."""


class StepOwner(Protocol):
    """The Recorder as its contexts see it: its public state and methods, and its parts."""

    parts: RecorderParts
    step_index: int
    steps_completed: int
    activation_every: int
    device: torch.device
    clock: Clock
    phase: str | None
    inflight: InFlight

    def event(self, name: str, **fields: Any) -> None: ...

    def flush(self) -> None: ...

    def memory_breakdown(self) -> dict[str, Any]: ...

    def check_memory_budget(self, memory: dict[str, Any]) -> None: ...

    def record_comm_event(self, e: CommEvent) -> None: ...

    def comm_issued(self, e: CommEvent) -> None: ...

    def record_exception(self, exc: BaseException, tb: Any) -> None: ...
