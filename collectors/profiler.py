"""A window of steps captured with the PyTorch profiler (Kineto) beside the run's own records.

    window = ProfilerWindow.open(rec, start=2, stop=4)   # steps [2, 4) -> RUN/traces/
    rec.on_step_end(window.step)                          # advances the profiler's schedule
    ...
    window.close()

Each rank writes `RUN/traces/rank<R>.<...>.pt.trace.json.gz` (torch's tensorboard trace
handler), which `diag analyze RUN` reads next to the records: kernels, NCCL bytes and overlap
on GPUs, CPU operators on gloo. Profiling costs time, so the window should stay short; like
every collector, an error here is logged once and training goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from collectors.safety import guarded
from diag.contract.schema import TRACES_DIR


class ProfilerWindow:
    def __init__(self, profiler: Any) -> None:
        self._profiler = profiler

    @classmethod
    @guarded(default=None)
    def open(cls, run_dir: str | Path, rank: int, start: int, stop: int) -> ProfilerWindow | None:
        """Start a profiler that records steps [start, stop) of this rank; None when
        `stop <= start` or the profiler cannot start."""
        if stop <= start or start < 0:
            return None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        folder = Path(run_dir) / TRACES_DIR
        profiler = torch.profiler.profile(
            activities=activities,
            # the shapes: on gloo, the only place a trace gives a collective's bytes
            # (diag/read/kineto/gloo_sizes.py); on NCCL, older PyTorch's
            record_shapes=True,
            schedule=torch.profiler.schedule(wait=start, warmup=0, active=stop - start, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                str(folder), worker_name=f"rank{rank}", use_gzip=True
            ),
        )
        profiler.start()
        return cls(profiler)

    @guarded()
    def step(self) -> None:
        self._profiler.step()

    @guarded()
    def close(self) -> None:
        self._profiler.stop()
