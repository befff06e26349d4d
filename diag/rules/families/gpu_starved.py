"""The GPU starved by its host (HST002, profiler traces: diag/metrics/device_time.py): the device
waits for its CPU to launch work (pattern 3: the speedup is below theory), and what the traces
say keeps the CPU (small kernels, synchronisations, the data loader, slow launches)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import pandas as pd

from diag.outputs.units import ranks_phrase
from diag.rules.device_words import device_word, for_device
from diag.rules.engine import Finding, RuleContext, Threshold, grade, rule
from diag.rules.families.balance import straggler_ranks

STARVED_RULE = "HST002"
STARVED_THRESHOLDS = {
    "low": Threshold(0.05, "fraction", "share of the device's time idle waiting for its host: low"),
    "medium": Threshold(0.10, "fraction", "share waiting for the host: medium"),
    "high": Threshold(0.25, "fraction", "share waiting for the host: high"),
    "small_kernel_launches": Threshold(
        2.0,
        "ratio",
        "a median kernel at most this many times its launch's CPU time (or 10 us) is small: "
        "the CPU cannot launch kernels as fast as the GPU runs them",
    ),
    "many_kernels": Threshold(50, "kernels", "kernels per step from which small ones add up"),
    "gaps_before_kernels": Threshold(
        0.5,
        "fraction",
        "share of the small kernels preceded by a host gap from which they are the bottleneck",
    ),
    "slow_launch_us": Threshold(
        20.0, "us", "mean CPU time of a kernel launch from which the launches themselves are slow"
    ),
    "explains_share": Threshold(
        0.10, "fraction", "share of the host wait a cause must explain to be named"
    ),
}
SMALL_KERNEL_US = 10.0
"""A kernel this short is small whatever its launch costs (a launch takes ~5-10 us of CPU)."""


@rule(STARVED_RULE, "host.gpu_starved", pattern=3, thresholds=STARVED_THRESHOLDS)
def gpu_starved(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The GPU is starved by its host: it sits idle waiting for the CPU to launch work.

    Symptom:
        In a profiler trace, the device is idle between kernels that its CPU thread launched
        only after the previous kernel had ended (HTA's "host wait"): the GPU ran dry and
        waited. Idle time is large, compute small, and more GPUs or a faster GPU would not
        make the step shorter.
    Likely cause:
        Read from the trace, in order of the time it explains: the data loader's wait for the
        next batch (`enumerate(DataLoader)` events); many small kernels, each shorter than
        the CPU takes to launch it (the median kernel against the mean `cudaLaunchKernel`),
        so the CPU cannot keep up; slow launches themselves (tens of us each:
        `CUDA_LAUNCH_BLOCKING=1`, a tool hooking launches, a contended core); synchronising
        calls in the step (`cudaStreamSynchronize`, `cudaDeviceSynchronize`, `.item()` as
        `aten::item` / `aten::_local_scalar_dense`),
        each of which drains the GPU's queue before the CPU launches again; else the CPU's
        own work between launches (Python, host-side code).
    Fix:
        For small kernels and launch overhead: capture the step in CUDA graphs
        (`torch.compile(mode="reduce-overhead")`, `torch.cuda.graphs`), fuse kernels with
        `torch.compile`, raise the (micro-)batch size so each kernel does more. For slow
        launches: unset `CUDA_LAUNCH_BLOCKING`, detach what hooks the launches, give the rank
        its cores. For synchronising calls: no `.item()`, `float(t)`, `print` of GPU tensors or
        `torch.cuda.synchronize()` in the step; keep metrics on the GPU and read them every N
        steps; `non_blocking=True` copies. For the loader: more `num_workers`,
        `pin_memory=True`, `prefetch_factor`.
    Evidence:
        Per rank, from its trace: the share of the device's time idle with the host to blame
        (the gaps between the device's busy runs, every stream together, whose next kernel
        was launched after the gap began), HTA's split of the idle time summed over streams
        (host wait, kernel wait, other), the step with and without that wait (its cost), the
        kernels per step and their median duration, the launches' mean CPU time, the
        synchronising calls and `.item()` reads per step, the data loader's wait. Profiler
        traces only: a run directory records no kernels.
    """
    table = ctx.metrics.device
    over = ranks_over(table, "device_host_wait_share", limits["low"])
    if over is None:
        return []
    starved, ranks, typical = over
    share = float(typical["device_host_wait_share"])
    # the step as the report measures it (each step's device window) where the replay has
    # one, else the device's time per profiled step; the host's share of the device's time
    # is its share of the step
    measured = ctx.metrics.attribution.measured_step_s if ctx.metrics.attribution else 0.0
    step_s = measured if measured > 0 else float(typical["step_s"])
    cost_s = share * step_s
    severity = grade(share, limits) or "low"
    causes = starving_causes(typical, limits)
    fixes = list(dict.fromkeys(c.fix for c in causes))
    evidence: dict[str, Any] = {
        "ranks": ranks,
        "ranks_measured": len(table),
        "host_wait_share_of_device_time": share,
        "host_wait_share_by_rank": {
            int(r): float(v)
            for r, v in zip(starved["rank"], starved["device_host_wait_share"], strict=True)
        },
        "idle_share": float(typical["idle_share"]),
        "hta_idle_split": {
            "host_wait": or_none(typical["host_wait_share"]),
            "kernel_wait": or_none(typical["kernel_wait_share"]),
            "other": or_none(typical["other_idle_share"]),
        },
        "step_s": step_s,
        "step_without_host_wait_s": step_s - cost_s,
        "device_time_per_step_s": float(typical["step_s"]),
        "host_wait_per_step_s": float(typical["host_wait_per_step_s"]),
        "kernels_per_step": or_none(typical["kernels_per_step"]),
        "kernel_median_us": or_none(typical["kernel_median_us"]),
        "launch_mean_us": or_none(typical["launch_mean_us"]),
        "sync_calls_per_step": or_none(typical["sync_calls_per_step"]),
        "scalar_reads_per_step": or_none(typical["scalar_reads_per_step"]),
        "loader_per_step_s": or_none(typical["loader_per_step_s"]),
        "host_gaps_per_step": or_none(typical["host_gaps_per_step"]),
        "likely_causes": [c.name for c in causes],
        "causes_shown": [c.shows for c in causes],
        "counterfactual": "the device never waits for its host: each step without the idle "
        "gaps its host left (the median over the named ranks)",
    }
    everyone = len(ranks) == ctx.run.manifest.world_size and len(ranks) > 1
    where = "every rank" if everyone else ranks_phrase(ranks)
    device_type = ctx.run.manifest.device_type
    title = (
        f"{device_word(device_type)} starved by its host on {where}: idle {share:.0%} of its "
        "time waiting for the CPU "
        f"to launch work; the step would be {_ms(step_s - cost_s)} instead of {_ms(step_s)} "
        f"(likely: {causes[0].name})"
    )
    return [
        Finding(
            severity=severity,
            title=title,
            ranks=ranks,
            evidence=evidence,
            advice=for_device("; ".join(fixes), device_type),
            margin=share / limits["high"],
            # a GPU that waits for its CPU makes every collective and every gap look like
            # the device's: exposed communication and uneven device time follow from it. Only
            # a high finding claims them: a little host wait beside a communication-bound job
            # must not take the communication's severity and the first place
            explains=["COM001", "BAL004", *_explained_stragglers(ctx, ranks)]
            if severity == "high"
            else [],
            cost_s=cost_s,
            cost_share=share,
        )
    ]


def _explained_stragglers(ctx: RuleContext, starved: list[int]) -> list[str]:
    """BAL001 and BAL003 when every rank they blame is one whose GPU waits for its host: the
    rank is slow because its CPU cannot feed its GPU, and that is the diagnosis."""
    stragglers = straggler_ranks(ctx)
    return ["BAL001", "BAL003"] if stragglers and set(stragglers) <= set(starved) else []


class StarvingCause(NamedTuple):
    explains_s: float  # of the host wait per step
    name: str
    shows: str  # what the trace shows
    fix: str


_GRAPHS_FIX = (
    "CUDA graphs (torch.compile(mode='reduce-overhead'), torch.cuda.graphs) or torch.compile "
    "to fuse kernels; a larger (micro-)batch per kernel"
)
_SYNC_FIX = (
    "fewer syncs: no .item()/float()/print of GPU tensors or torch.cuda.synchronize() in the "
    "step (read metrics every N steps), non_blocking copies"
)
_LOADER_FIX = "more DataLoader workers (num_workers), pin_memory=True, a larger prefetch_factor"
_LAUNCH_FIX = (
    "unset CUDA_LAUNCH_BLOCKING, detach debuggers or tools that hook kernel launches, give the "
    "rank its own cores (HST001); fewer launches with CUDA graphs or torch.compile"
)
_CPU_FIX = (
    "profile the CPU side of the step; torch.compile or CUDA graphs take Python off the launch path"
)


def starving_causes(typical: pd.Series, limits: Mapping[str, float]) -> list[StarvingCause]:
    """The likely causes, the one that explains the most of the host wait first. What each
    explains, per step: the loader's wait; one host gap (the mean) per synchronising call;
    for small kernels or slow launches, the rest when a host gap precedes most kernels (the
    CPU issues them slower than the GPU runs them), else the CPU's time in the launches; the
    rest is the CPU's own work. Causes below `explains_share` are not named."""
    wait_s = _num(typical["host_wait_per_step_s"])
    gaps = _num(typical["host_gaps_per_step"])
    mean_gap_s = wait_s / gaps if gaps > 0 else 0.0
    found: list[StarvingCause] = []
    loader_s = _num(typical["loader_per_step_s"])
    if loader_s > 0:
        shows = f"the training thread waits {_ms(loader_s)} a step for its next batch"
        found.append(StarvingCause(loader_s, "a data-loader wait", shows, _LOADER_FIX))
    syncs = _num(typical["sync_calls_per_step"])
    if syncs >= 1:
        reads = _num(typical["scalar_reads_per_step"])
        of_which = f" ({reads:.0f} of them .item() reads)" if reads >= 1 else ""
        shows = (f"{syncs:.0f} synchronising calls a step{of_which}: each drains the GPU's "
                 "queue before the CPU launches again")  # fmt: skip
        found.append(
            StarvingCause(min(syncs, gaps) * mean_gap_s, "synchronising calls", shows, _SYNC_FIX)
        )
    median_us, launch_us = _num(typical["kernel_median_us"]), _num(typical["launch_mean_us"])
    per_step = _num(typical["kernels_per_step"])
    small = median_us <= max(limits["small_kernel_launches"] * launch_us, SMALL_KERNEL_US)
    slow = launch_us >= limits["slow_launch_us"]
    if slow or (small and per_step >= limits["many_kernels"]):
        # a host gap before most kernels: the CPU issues them slower than the GPU runs them,
        # and that explains whatever the loader and the syncs do not; else at least the
        # CPU's time in the launches themselves
        everywhere = gaps >= limits["gaps_before_kernels"] * per_step
        rest_s = wait_s - sum(c.explains_s for c in found)
        explains_s = max(rest_s if everywhere else 0.0, _num(typical["launch_per_step_s"]))
        share = f"; a host gap before {gaps / per_step:.0%} of them" if per_step else ""
        if slow:  # then every kernel is "small": the launch path is what is wrong
            shows = (f"each kernel launch takes {launch_us:.0f} us of CPU (a few us is usual: "
                     "CUDA_LAUNCH_BLOCKING=1, a tool hooking launches, a contended core)"
                     f"{share}")  # fmt: skip
            found.append(StarvingCause(explains_s, "slow kernel launches", shows, _LAUNCH_FIX))
        else:
            shows = (f"{per_step:.0f} kernels a step, the median {median_us:.0f} us, "
                     f"{launch_us:.1f} us of CPU to launch each{share}")  # fmt: skip
            found.append(StarvingCause(explains_s, "many small kernels", shows, _GRAPHS_FIX))
    rest_s = wait_s - sum(c.explains_s for c in found)
    shows = "the CPU thread is busy between launches (Python, host-side code)"
    found.append(StarvingCause(rest_s, "the CPU's own work between launches", shows, _CPU_FIX))
    named = [c for c in found if c.explains_s >= limits["explains_share"] * wait_s]
    return sorted(named or found[-1:], key=lambda c: -c.explains_s)


def _num(value: Any) -> float:
    return 0.0 if value is None or pd.isna(value) else float(value)


def ranks_over(
    table: pd.DataFrame, column: str, low: float
) -> tuple[pd.DataFrame, list[int], pd.Series] | None:
    """The device table's rows whose `column` is at least `low`, their ranks and their median
    row (the typical rank); None without such a row (or without the column)."""
    if table.empty or column not in table:
        return None
    rows = table[table[column] >= low]
    if rows.empty:
        return None
    return rows, sorted(int(r) for r in rows["rank"]), rows.median(numeric_only=True)


def or_none(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
