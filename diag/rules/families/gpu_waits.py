"""The GPU idle with its work already launched (HST003, profiler traces): the gaps between the
device's busy runs (every stream together) whose next kernel its CPU had launched before the
gap began (diag/read/kineto/idle.py). The host is not what it waited for (that is HST002): the
kernel sat in its queue behind a dependency the trace does not record. Said rather than read
as healthy idle: a trace without such a finding would claim the idle time for nobody."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from diag.outputs.units import ranks_phrase
from diag.rules.device_words import device_word, for_device
from diag.rules.engine import Finding, RuleContext, Threshold, grade, rule
from diag.rules.families.gpu_starved import or_none, ranks_over

QUEUED_RULE = "HST003"
QUEUED_THRESHOLDS = {
    "low": Threshold(
        0.10, "fraction", "share of the device's time idle with its next kernel launched: low"
    ),
    "medium": Threshold(0.20, "fraction", "share idle with work launched: medium"),
    "high": Threshold(0.40, "fraction", "share idle with work launched: high"),
}


@rule(QUEUED_RULE, "host.gpu_waits_on_a_dependency", pattern=3, thresholds=QUEUED_THRESHOLDS)
def gpu_waits_on_a_dependency(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The GPU sits idle although its next kernel is already launched: it waits on something.

    Symptom:
        In a profiler trace, the device (every stream together) is idle in gaps whose next
        kernel the CPU had launched before the gap began: the work was queued and did not
        run. Neither the host (HST002: it launches after the gap began) nor launch overhead
        explains it.
    Likely cause:
        A dependency the trace does not record: a stream waiting on an event of another
        stream or process (`cudaStreamWaitEvent`: a compute stream waiting for a copy or a
        collective issued elsewhere), an edge inside a CUDA graph (`cudaGraphLaunch` queues the
        whole graph; a node waiting on an external event or a host node stalls it), a
        host-to-device copy from pageable memory, a peer's communication outside any kernel.
    Fix:
        Find the dependency: Nsight Systems (`nsys profile --trace=cuda,nvtx`) shows what the
        queued kernel waits for; the profiler's `with_stack=True` around the longest gap names
        the code that recorded the event. Then remove or overlap it (pinned memory and
        `non_blocking=True` copies, the collective issued earlier, no cross-stream wait on
        work that can run later, graph nodes without host callbacks).
    Evidence:
        Per rank, from its trace: the share of the device's time idle with its next kernel
        launched, the time per step, the longest such gap, the idle waiting for the host beside
        it, HTA's idle split (its `other` holds these gaps), and whether the step's kernels come
        from CUDA graph launches. The cost is what the step would save if the device never
        waited with work queued: a bound, as some dependency may be inherent.
    """
    table = ctx.metrics.device
    over = ranks_over(table, "device_queued_wait_share", limits["low"])
    if over is None:
        return []
    waiting, ranks, typical = over
    share = float(typical["device_queued_wait_share"])
    # the step as the report measures it: the replay's, else the summary's (the device's time
    # per profiled step can be shorter: kernels start after the step does)
    measured = ctx.metrics.attribution.measured_step_s if ctx.metrics.attribution else 0.0
    summary_s = ctx.metrics.summary.get("step_time_s")
    step_s = (
        measured if measured > 0
        else float(summary_s) if isinstance(summary_s, int | float) and summary_s > 0
        else float(typical["step_s"])
    )  # fmt: skip
    cost_s = share * step_s
    longest_s = float(waiting["longest_queued_gap_s"].max())
    graphs = int(waiting["graph_launches"].sum()) > 0
    evidence: dict[str, Any] = {
        "ranks": ranks,
        "ranks_measured": len(table),
        "queued_wait_share_of_device_time": share,
        "queued_wait_share_by_rank": {
            int(r): float(v)
            for r, v in zip(waiting["rank"], waiting["device_queued_wait_share"], strict=True)
        },
        "queued_wait_per_step_s": float(typical["queued_wait_per_step_s"]),
        "longest_queued_gap_s": longest_s,
        "host_wait_share_of_device_time": or_none(typical.get("device_host_wait_share")),
        "idle_share": or_none(typical.get("idle_share")),
        "hta_idle_split_other": or_none(typical.get("other_idle_share")),
        "cuda_graph_launches": graphs,
        "step_s": step_s,
        "counterfactual": "the device never waits with its next kernel launched: each step "
        "without those gaps (the median over the named ranks; a bound)",
    }
    everyone = len(ranks) == ctx.run.manifest.world_size and len(ranks) > 1
    where = "every rank" if everyone else ranks_phrase(ranks)
    inside = " (its kernels come from CUDA graph launches: an edge inside a graph)" * graphs
    device_type = ctx.run.manifest.device_type
    title = (
        f"{device_word(device_type)} idle with its work already launched on {where}: "
        f"{share:.0%} of its time the next "
        f"kernel sat queued (longest gap {longest_s * 1e3:.1f} ms), waiting on a dependency the "
        f"trace does not record{inside}; up to {cost_s * 1e3:.1f} ms of the step"
    )
    return [
        Finding(
            severity=grade(share, limits) or "low",
            title=title,
            ranks=ranks,
            evidence=evidence,
            advice=for_device(
                "find what the queued kernel waits for (Nsight Systems; the profiler's "
                "with_stack around the longest gap): a cross-stream or cross-process event, a "
                "CUDA graph's edge, a pageable host-to-device copy; then remove or overlap it",
                device_type,
            ),
            margin=share / limits["high"],
            cost_s=cost_s,
            cost_share=share,
        )
    ]
