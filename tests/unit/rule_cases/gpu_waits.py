"""Cases for HST003 (the GPU idle with its next kernel launched): GPU jobs' trace folders in the
shape real traces have (rule_cases/_gpu_traces.py)."""

from __future__ import annotations

from rule_cases import RuleCase
from rule_cases._gpu_traces import gpu_bound, host_bound, write_job

CASES = [
    RuleCase("HST003", True,
             lambda runs: write_job(runs.root / "queued", gpu_bound(world=4, queued_wait_us=8000)),
             "4 GPUs wait 8 ms a step with their next GEMM queued (an unrecorded event)",
             severity="medium", ranks=(0, 1, 2, 3)),
    RuleCase("HST003", False, lambda runs: write_job(runs.root / "gpu-bound", gpu_bound(world=4)),
             "GEMMs queued back to back: the device never waits with work launched"),
    RuleCase("HST003", False, lambda runs: write_job(runs.root / "host-bound", host_bound(4)),
             "the idle of a host-bound job is the host's (HST002), not a queued dependency"),
]  # fmt: skip
