"""`diag plan --from RUN`: the compute rate, link bandwidth, optimizer bandwidth and host
overhead of a measured run, as a cluster the plan predicts other layouts on.

From the run's tables (diag.load_any: a run directory, or a trace folder with its layout):
- compute: each rank's forward and backward spans per step, less the blocking TP / EP / CP
  collectives inside them, against the FLOPs the plan gives that layout: the achieved FLOP/s
  (the compute efficiency, when the device is a known one);
- links: the median bus bandwidth of the run's collectives (bytes x bus factor / duration),
  as the plan's bytes on the intra-node link (inter-node too when the run spans hosts); and
  with a pipeline, the latency of one message (`pipeline_message_s`) as every message's
  fixed cost: the schedule pays it at each receive, v times as many with interleaving;
- optimizer: the `opt` spans against the simulator's 30 B/param of HBM traffic;
- overhead: what the measured step holds beyond the calibrated prediction (data loading,
  Python), carried to every layout predicted for this machine.
The medians over steps after the first (warm-up) and the slowest rank's median make a CPU
hog beside the run move the figures by its share of the time, not flip them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import ledger
from diag.contract.devices import device_for_name
from diag.contract.schema import Layout as RunLayout
from diag.contract.schema import Manifest
from diag.errors import InputError
from diag.plan.job import Cluster, Job, Layout
from diag.plan.memory import PARAM_BYTES
from diag.plan.timing import layer_forward_flops, step_time
from diag.whatif.matching import P2P_OPS, message_pair_rows
from simulator.config import ModelSpec
from simulator.hardware import HardwareSpec

INSIDE_COMPUTE_GROUPS = ("tp", "ep", "cp")
"""Groups whose blocking collectives run inside the forward and backward spans."""


@dataclass(frozen=True)
class Calibration:
    """What was measured and what it made of the cluster."""

    path: str
    job: Job
    layout: Layout
    cluster: Cluster
    measured_step_s: float
    measured_compute_s: float
    achieved_flops_per_s: float
    link_GBps: float | None  # median bus bandwidth of the collectives (None: no collective)
    optimizer_s: float
    overhead_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "layout": self.layout.key(),
            "measured_step_s": self.measured_step_s,
            "measured_compute_s": self.measured_compute_s,
            "achieved_tflops": self.achieved_flops_per_s / 1e12,
            "compute_efficiency": self.cluster.hardware.mfu,
            "link_GBps": self.link_GBps,
            "optimizer_s": self.optimizer_s,
            "overhead_s": self.overhead_s,
        }


def job_of(run: Any, path: str, model: ModelSpec | None = None) -> tuple[Job, Layout]:
    """The model, batch and layout a run's manifest declares (`model` given: that model, for a
    trace folder, whose traces say nothing of it); InputError naming what lacks."""
    manifest = run.manifest
    info, lay = manifest.model, manifest.layout
    if model is not None:
        return _job(model, layout_of(lay), lay)
    needed = {
        "layers": info.layers,
        "hidden": info.hidden,
        "heads": info.heads,
        "seq_len": info.seq_len,
        "micro_batch": info.micro_batch,
        "vocab": info.vocab,
    }
    missing = [k for k, v in needed.items() if not v]
    if missing:
        raise InputError(
            path,
            f"the model lacks {', '.join(missing)}: give it (--model, or --layers --hidden ...)",
        )
    model = ModelSpec(
        layers=int(info.layers),
        hidden=int(info.hidden),
        heads=int(info.heads),
        seq_len=int(info.seq_len),
        micro_batch=int(info.micro_batch),
        vocab=int(info.vocab),
        ffn_hidden=int(info.ffn_hidden) if info.ffn_hidden else None,
        experts=int(info.experts or 0),
        topk=int(info.topk or 2),
        tied_embeddings=(lay.pp or 1) == 1,
    )
    return _job(model, layout_of(lay), lay)


def _job(model: ModelSpec, layout: Layout, lay: RunLayout) -> tuple[Job, Layout]:
    accumulation = max(int(lay.grad_accum or 1), 1)
    per_step = layout.microbatches * (accumulation if layout.pp == 1 else 1)
    layout = replace(layout, microbatches=per_step)
    job = Job(model, layout.dp * model.micro_batch * per_step, model.micro_batch)
    return job, layout


def layout_of(lay: RunLayout) -> Layout:
    """The plan's layout of a manifest's layout (ep counted inside dp, as the plan does)."""
    dp, ep = int(lay.dp or 1), int(lay.ep or 1)
    return Layout(
        dp=dp * ep,
        tp=int(lay.tp or 1),
        pp=int(lay.pp or 1),
        cp=int(lay.cp or 1),
        ep=ep,
        zero=int(lay.zero_stage or 0),
        microbatches=max(int(lay.microbatches or 1), 1),
        v=max(int(lay.virtual_stages or 1), 1),
        recompute="none",
    )


def _per_rank_step(frame: pd.DataFrame, first_step: int) -> pd.Series:
    """Summed durations (s) per (rank, step) after the warm-up step."""
    frame = frame[frame["step"] > first_step]
    seconds = (frame["t1"] - frame["t0"]).astype(float) / 1e9
    return seconds.groupby([frame["rank"], frame["step"]]).sum()


def _slowest_median(values: pd.Series) -> float:
    """The largest per-rank median: the rank that paces the step."""
    if values.empty:
        return 0.0
    return float(values.groupby(level=0).median().max())


def _pass_overhead_s(spans: pd.DataFrame, first_step: int) -> float:
    """The fixed cost of one pass, from the median forward (f) and backward (b) span after
    the warm-up step: a backward has twice the forward's FLOPs, so f = c + w and b = c + 2w
    give c = 2f - b (kept within 0..f: noise or a heavier backward make it 0)."""
    passes = spans[(spans["step"] > first_step) & spans["phase"].isin(["fwd", "bwd"])]
    seconds = (passes["t1"] - passes["t0"]).astype(float) / 1e9
    medians = seconds.groupby(passes["phase"].astype(str)).median()
    if "fwd" not in medians or "bwd" not in medians:
        return 0.0
    forward, backward = float(medians["fwd"]), float(medians["bwd"])
    return min(max(2 * forward - backward, 0.0), forward)


def _waits_inside_compute(spans: pd.DataFrame) -> pd.DataFrame:
    """The comm_wait spans that lie inside a forward or backward span of their rank and step
    (DDP's wait for its last bucket at the end of backward): waiting, not computing."""
    waits = spans[spans["phase"] == "comm_wait"]
    work = spans[spans["phase"].isin(["fwd", "bwd"])][["rank", "step", "t0", "t1"]]
    if waits.empty or work.empty:
        return waits.iloc[:0]
    pairs = waits.reset_index().merge(work, on=["rank", "step"], suffixes=("", "_work"))
    inside = pairs[(pairs["t0"] >= pairs["t0_work"]) & (pairs["t1"] <= pairs["t1_work"])]
    return waits.loc[inside["index"].unique()]


def _median_of(values: pd.Series, rank: int) -> float:
    """One rank's median (0 when it has none)."""
    if values.empty:
        return 0.0
    medians = values.groupby(level=0).median()
    return float(medians.get(rank, 0.0))


def calibrate(run: Any, path: str, model: ModelSpec | None = None) -> Calibration:
    """Calibrate the cost model on `run` (a loaded RunData; `model` for a trace folder);
    InputError when it lacks steps or compute."""
    manifest = run.manifest
    if manifest.layout_unknown:
        raise InputError(path, f"its layout is {manifest.layout_source}: give it with --run-layout")
    if manifest.layout.pp > 1 and not manifest.schedule_known:
        why = "its traces do not say the micro-batches per step: give them with --run-layout"
        raise InputError(path, f"{why} (m=N, and v=N for an interleaved schedule)")
    if not manifest.zero_known:
        why = "its traces do not say the ZeRO stage: give it with --run-layout (zero=N)"
        raise InputError(path, why)
    if manifest.layout.pp == 1 and not manifest.accumulation_known:
        why = "its traces do not say the gradient accumulation: give it with --run-layout"
        raise InputError(path, f"{why} (ga=N, 1 for none)")
    job, layout = job_of(run, path, model)
    steps = run.steps
    first = int(steps["step"].min()) if not steps.empty else 0
    later = steps[steps["step"] > first] if steps["step"].nunique() > 1 else steps
    if later.empty:
        raise InputError(path, "no step records: nothing to calibrate on")
    step_s = _slowest_median(_per_rank_step(later, first - 1))
    spans = run.spans
    # a run directory's forward and backward spans; a profiler trace's computation kernels
    phases = ["fwd", "bwd"] if spans["phase"].isin(["fwd", "bwd"]).any() else ["kernel"]
    compute = _per_rank_step(spans[spans["phase"].isin(phases)], first)
    comms = run.comms
    inside = comms[comms["group"].isin(INSIDE_COMPUTE_GROUPS) & comms["blocking"].fillna(False)]
    compute = compute.sub(_per_rank_step(inside, first), fill_value=0.0)
    compute = compute.sub(_per_rank_step(_waits_inside_compute(spans), first), fill_value=0.0)
    compute_s = _slowest_median(compute)
    if compute_s <= 0:
        raise InputError(path, "no forward/backward spans or kernels: cannot calibrate compute")
    passes = layout.microbatches * layout.v * 2  # forward and backward of each chunk
    pass_s = _pass_overhead_s(spans, first) if phases == ["fwd", "bwd"] else 0.0
    # the fixed costs take at most half the measured compute (the estimate is a difference
    # of two medians), and the rest is FLOPs: the calibrated model gives the measured compute
    pass_s = min(pass_s, compute_s / (2 * passes))
    flop_s = compute_s - passes * pass_s
    # the rank that computes longest paces the step: its own waits are transfers, not skew
    pacing = int(compute.groupby(level=0).median().idxmax())
    opt_s = _median_of(_per_rank_step(spans[spans["phase"] == "opt"], first), pacing)
    # blocking collectives sit on the critical path whole; DDP's async all-reduces overlap the
    # backward, so only their exposed wait (comm_wait) says what the link carries
    # (point-to-point messages are left out: a blocking recv mostly waits for its sender)
    collective = ~comms["op"].isin(P2P_OPS)
    blocking = comms[comms["blocking"].fillna(False).astype(bool) & collective]
    link = _median_busbw_GBps(blocking)
    message_s = pipeline_message_s(comms, run.manifest, first)
    device = device_for_name(run.manifest.ranks[0].device_name if run.manifest.ranks else None)
    hw = _hardware(run, job, layout, flop_s, opt_s, link, device)
    if message_s is not None:  # the alpha of every message on this machine, measured
        latency_us = message_s * 1e6
        hw = replace(hw, intra_latency_us=latency_us, inter_latency_us=latency_us)
    per_node = int(run.manifest.hardware.gpus_per_node or layout.world)
    cluster = Cluster(layout.world, per_node, hw, device.key if device else None,
                      pass_overhead_s=pass_s)  # fmt: skip
    if link is None and layout.dp > 1:
        wait_s = _median_of(_per_rank_step(spans[spans["phase"] == "comm_wait"], first), pacing)
        cluster = _fit_dp_link(job, layout, cluster, wait_s)
        link = cluster.hardware.intra_node_GBps * cluster.hardware.nccl_efficiency
    predicted = step_time(job, layout, cluster)
    overhead = max(step_s - predicted.step_s, 0.0)
    cluster = replace(cluster, overhead_s=overhead)
    flops = compute_flops(job, layout)
    return Calibration(
        path, job, layout, cluster, step_s, compute_s, flops / flop_s, link, opt_s, overhead
    )


def pipeline_message_s(comms: pd.DataFrame, manifest: Manifest, first_step: int) -> float | None:
    """Mean seconds a pipeline receive takes once its message has been sent: the receive's end
    less the later of its start and its send's start (None without any), each receive paired
    with its send by peers and order (diag/whatif/matching.py). A message moves only when both
    ends are in the call (gloo's rendezvous), so this is what each of a schedule's receives
    costs beyond waiting for the sender: on a loaded CPU, the sender's wake-up. The mean,
    since the schedule pays the sum."""
    later = comms[comms["step"] > first_step].reset_index(drop=True)
    receives, sends = message_pair_rows(later, manifest)
    if not len(receives):
        return None
    t0, t1 = later["t0"].to_numpy(dtype=np.int64), later["t1"].to_numpy(dtype=np.int64)
    waited = t1[receives] - np.maximum(t0[receives], t0[sends])
    return float(waited.mean()) / 1e9


def _fit_dp_link(job: Job, layout: Layout, cluster: Cluster, wait_s: float) -> Cluster:
    """The link bandwidth at which the model's exposed DP all-reduce is the measured wait
    (bisection on a log scale: the exposed time falls as the bandwidth grows)."""

    def with_link(gbps: float) -> Cluster:
        hw = replace(cluster.hardware, intra_node_GBps=gbps, inter_node_GBps=gbps)
        return replace(cluster, hardware=hw)

    low, high = 1e-4, 1e4  # GB/s
    for _ in range(60):
        mid = (low * high) ** 0.5
        if step_time(job, layout, with_link(mid)).dp_s > wait_s:
            low = mid
        else:
            high = mid
    return with_link(high)


def compute_flops(job: Job, layout: Layout) -> float:
    """FLOPs one GPU of the heaviest stage computes per step in `layout` (what the plan's
    compute time is made of): forward + backward + recomputation, over tp x cp."""
    # the plan's compute time at 1 FLOP/ns; its ratio to the measured time is the rate
    unit = HardwareSpec(device_tflops=1e-3, mfu=1.0)
    cluster = Cluster(layout.world, layout.world, unit)
    return step_time(job, layout, cluster).compute_s * 1e9


def _median_busbw_GBps(comms: pd.DataFrame) -> float | None:
    if comms.empty:
        return None
    seconds = (comms["t1"] - comms["t0"]).astype(float) / 1e9
    factor = np.array(
        [
            ledger.bus_factor(op, int(n))
            for op, n in zip(comms["op"], comms["group_size"].fillna(2), strict=True)
        ]
    )
    # the plan counts 16-bit messages; a run in another dtype moves bytes in that ratio
    scale = PARAM_BYTES / np.array([_dtype_bytes(d) for d in comms["dtype"]], dtype=float)
    busbw = comms["bytes"].astype(float).to_numpy() * factor * scale / seconds.to_numpy()
    good = busbw[np.isfinite(busbw) & (busbw > 0)]
    return float(np.median(good)) / 1e9 if good.size else None


def _dtype_bytes(name: object) -> int:
    try:
        return ledger.dtype_bytes(str(name))
    except ValueError:
        return PARAM_BYTES


def _hardware(
    run: Any,
    job: Job,
    layout: Layout,
    compute_s: float,
    opt_s: float,
    link: float | None,
    device: Any,
) -> HardwareSpec:
    achieved = compute_flops(job, layout) / compute_s
    base = HardwareSpec()
    if device is not None:  # a known accelerator: its peak, the measured share of it
        peak_tflops, mfu = device.peak_tflops_bf16, min(achieved / device.peak_flops_per_s, 1.0)
    else:  # a CPU or an unknown part: the achieved rate is the peak
        peak_tflops, mfu = achieved / 1e12, 1.0
    nccl = base.nccl_efficiency
    link_GBps = link / nccl if link else base.intra_node_GBps
    hbm = base.hbm_GBps
    if opt_s > 0:
        from diag.plan.memory import stage_params

        hbm = 30 * stage_params(job, layout) / (layout.dp if layout.zero else 1) / (opt_s * 1e9)
    memory = run.manifest.hardware.device_memory_bytes
    name = run.manifest.ranks[0].device_name if run.manifest.ranks else None
    return HardwareSpec(
        device_name=f"{name or run.manifest.device_type or 'device'} (calibrated)",
        device_tflops=peak_tflops,
        mfu=mfu,
        hbm_GBps=hbm,
        device_memory_gb=(memory / 1e9) if memory else base.device_memory_gb,
        intra_node_GBps=link_GBps,
        inter_node_GBps=link_GBps,
        nccl_efficiency=nccl,
    )


__all__ = [
    "Calibration",
    "calibrate",
    "compute_flops",
    "job_of",
    "layer_forward_flops",
    "pipeline_message_s",
]
