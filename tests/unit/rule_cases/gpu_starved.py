"""Cases for the GPU-starved rule (HST002): GPUs waiting for their host to launch work, and GPUs
kept busy (profiler traces in the real traces' shape)."""

from __future__ import annotations

from rule_cases import RuleCase
from rule_cases._gpu_traces import gpu_bound, host_bound, write_job

CASES = [
    RuleCase("HST002", True, lambda runs: write_job(runs.root / "host-bound", host_bound()),
             "8 GPUs idle 29-84% between small kernels their CPUs launch too slowly",
             severity="high", ranks=tuple(range(8))),
    RuleCase("HST002", False, lambda runs: write_job(runs.root / "gpu-bound", gpu_bound()),
             "8 GPUs kept busy by long GEMMs queued well ahead of them"),
]  # fmt: skip
