"""The plan as text (what a person reads first) and as JSON (`diag.plan/1`, for scripts)."""

from __future__ import annotations

from dataclasses import asdict
from fractions import Fraction
from typing import Any

from diag.contract import ledger
from diag.contract.devices import DEVICES
from diag.plan import Plan
from diag.plan.activations import block_activation_bytes
from diag.plan.evaluate import GB, Evaluation
from diag.plan.frameworks import GENERIC, State
from diag.plan.job import Cluster, Job, Layout
from diag.plan.nofit import NoFit

PLAN_SCHEMA = "diag.plan/1"
TOP = 5


def bubble_text(layout: Layout) -> str:
    """(p-1)/(v m + p-1) as a fraction and a share: `7/11 = 63.6%`."""
    p, m, v = layout.pp, layout.microbatches, layout.v
    if p == 1:
        return "0 (no pipeline)"
    share = ledger.bubble_fraction(p, m, v)
    return f"{Fraction(p - 1, v * m + p - 1)} = {share:.1%}"


def worked_figures(plan: Plan, layout: Layout | None) -> dict[str, float]:
    """The seed's worked numbers for this job: static state, Korthikanti's GPT-block
    activations per layer and for all layers (tp 1, no recomputation, the job's sequence and
    micro-batch), and the activations of the block the job trains (what the plan uses)."""
    m = plan.job.model
    per_layer = ledger.activation_bytes_per_layer(
        m.seq_len, plan.job.micro_batch, m.hidden, m.heads
    )
    block = block_activation_bytes(m, plan.job.training, m.seq_len, plan.job.micro_batch)
    return {
        "params": plan.job.total_params,
        "static_bytes": plan.static_bytes,
        "activation_bytes_per_layer": per_layer,
        "activation_bytes_all_layers": per_layer * m.layers,
        "block_activation_bytes_per_layer": block,
    }


def block_text(job: Job) -> str:
    """What the job's block stores beyond Korthikanti's GPT block: `GQA 8/128 heads, ...`."""
    m, k = job.model, job.training
    heads = m.heads if m.kv_heads is None else m.kv_heads
    parts = [f"GQA {heads}/{m.heads} heads" if heads != m.heads else "multi-head"]
    parts.append(f"{'SwiGLU' if m.gated_mlp else 'MLP'} {m.ffn}")
    parts.append("flash attention" if k.flash_attention else "scores stored")
    parts.append("dropout" if k.dropout else "no dropout")
    return ", ".join(parts)


def state_text(state: State) -> str:
    """What a framework keeps per parameter at one stage: `params 2 + grads 2 + fp32 grads
    4 + optimizer 12/d B/param` (d: the ZeRO group)."""
    parts = []
    named = (("params", state.params), ("grads", state.grads), ("fp32 grads", state.fp32_grads))
    for name, per in (*named, ("optimizer", state.optimizer)):
        terms = [f"{per.whole:g}"] if per.whole else []
        terms += [f"{per.sharded:g}/d"] if per.sharded else []
        if terms:
            parts.append(f"{name} {' + '.join(terms)}")
    return " + ".join(parts) + " B/param"


def framework_text(job: Job) -> str | None:
    """The framework line: what it keeps at each stage it runs, its reserve."""
    framework = job.framework
    if framework is GENERIC:
        return None
    stages = "; ".join(f"ZeRO-{z}: {state_text(framework.state[z])}" for z in framework.zero_stages)
    return (
        f"framework  {framework.key} ({framework.name}): {stages}; runtime reserve "
        f"{framework.reserve_bytes / GB:g} GB (docs/plan.md)"
    )


def _evaluation_json(e: Evaluation) -> dict[str, Any]:
    return {
        "layout": e.layout.key(),
        **{k: v for k, v in asdict(e.layout).items()},
        "step_time_s": e.step_s,
        "tokens_per_s": e.tokens_per_s,
        "mfu": e.mfu,
        "hfu": e.hfu,
        "bubble_fraction": e.bubble_fraction,
        "bubble": bubble_text(e.layout),
        "memory_bytes": e.memory.as_dict(),
        "memory_parts_bytes": e.memory.parts(),
        "time": e.time.as_dict(),
        "comm_bytes_per_step": e.comm_bytes,
        "rejected": e.rejected,
        "rejected_kind": e.rejected_kind,
        "notes": list(e.notes),
    }


def plan_json(plan: Plan, top: int = TOP) -> dict[str, Any]:
    """The `diag.plan/1` document."""
    job, cluster = plan.job, plan.cluster
    model = asdict(job.model)
    hw = asdict(cluster.hardware)
    shown = plan.ranked[:top] if len(plan.evaluated) > top else plan.evaluated
    return {
        "schema": PLAN_SCHEMA,
        "job": {
            "model": model,
            "params": job.total_params,
            "global_batch": job.global_batch,
            "micro_batch": job.micro_batch,
            "tokens_per_step": job.tokens_per_step,
            "framework": None if job.framework is GENERIC else job.framework.key,
        },
        "cluster": {
            "gpus": cluster.gpus,
            "gpus_per_node": cluster.gpus_per_node,
            "device": cluster.device_key,
            "hardware": hw,
            "given": dict(cluster.given),
            "overhead_s": cluster.overhead_s,
        },
        "worked": worked_figures(plan, None),
        "considered": len(plan.evaluated) + len(plan.invalid),
        "capped_at": plan.capped_at,
        "feasible": len(plan.ranked),
        "layouts": [_evaluation_json(e) for e in shown],
        "meshes": [_evaluation_json(e) for e in plan.meshes[:top]],
        "reasoning": [asdict(r) for r in plan.reasons],
        "near_misses": [{"layout": e.layout.key(), "why": why} for e, why in plan.misses],
        "no_fit": _no_fit_json(plan.no_fit),
    }


def _no_fit_json(nofit: NoFit | None) -> dict[str, Any] | None:
    if nofit is None:
        return None
    return {
        "budget_bytes": nofit.budget_bytes,
        "least": {"layout": nofit.least.layout.key(), "memory_bytes": nofit.least.memory.as_dict()},
        "floor_bytes": nofit.floor_bytes,
        "nearest_misses": [
            {
                "layout": e.layout.key(),
                "memory_bytes": e.memory.total_bytes,
                "over_bytes": e.memory.total_bytes - nofit.budget_bytes,
            }
            for e in nofit.misses
        ],
    }


def _gb(value: float) -> str:
    return f"{value / GB:,.1f} GB"


_GIVEN = {
    "device_memory_gb": "memory {:g} GB",
    "device_tflops": "peak {:g} TFLOP/s",
    "intra_node_GBps": "scale-up link {:g} GB/s",
    "inter_node_GBps": "scale-out link {:g} GB/s",
    "mfu": "compute efficiency {:g}",
    "gpus_per_node": "{:g} per node",
}
"""How the header names what the user set over the device table (Cluster.given)."""


def device_text(cluster: Cluster) -> str:
    """`NVIDIA H100 SXM 80GB (8 per node, 80 GB)`; after an override the table's name would
    claim a device the plan no longer prices, so what the user set is named as given:
    `h100 (memory 40 GB given, peak 312 TFLOP/s given, 8 per node)`."""
    hw = cluster.hardware
    given = dict(cluster.given)
    if not given:
        return f"{hw.device_name} ({cluster.gpus_per_node} per node, {hw.device_memory_gb:g} GB)"
    parts = [_GIVEN.get(k, k + " {:g}").format(v) + " given" for k, v in given.items()]
    if "gpus_per_node" not in given:
        parts.append(f"{cluster.gpus_per_node} per node")
    return f"{cluster.device_key or hw.device_name} ({', '.join(parts)})"


def efficiency_text(cluster: Cluster) -> str:
    """The compute's rate and where its share of the peak comes from: the device table
    (docs/plan.md), the user, or a measured run."""
    hw = cluster.hardware
    table = DEVICES.get(cluster.device_key or "")
    if "mfu" in dict(cluster.given):
        source = "given"
    elif hw.device_name.endswith("(calibrated)"):
        source = "calibrated"
    elif table is not None and table.compute_efficiency == hw.mfu:
        source = f"the {table.key}'s, docs/plan.md"
    else:
        source = "the cluster's"
    return (
        f"compute {hw.device_tflops:g} TFLOP/s peak x efficiency {hw.mfu:.2f} ({source}) = "
        f"{hw.device_tflops * hw.mfu:,.1f} TFLOP/s per GPU"
    )


def plan_text(plan: Plan, top: int = TOP) -> str:
    """The plan as a person reads it: the job, the worked numbers, the ranking, the reasons."""
    job, cluster = plan.job, plan.cluster
    w = worked_figures(plan, None)
    m = job.model
    lines = [
        f"plan  {cluster.gpus:,} x {device_text(cluster)}  global batch {job.global_batch} x "
        f"seq {m.seq_len}, micro-batch {job.micro_batch}",
        f"device  {efficiency_text(cluster)}",
        f"state   {job.total_params / 1e9:,.1f}B params x 16 B/param = {_gb(w['static_bytes'])}"
        f" static state (params 2 + grads 2 + fp32 master 4 + Adam 8)",
        f"activations, Korthikanti's GPT block (tp 1, no recompute, seq {m.seq_len}, "
        f"micro-batch {job.micro_batch}): "
        f"{w['activation_bytes_per_layer'] / GB:,.2f} GB per layer, "
        f"{_gb(w['activation_bytes_all_layers'])} for {m.layers} layers",
        f"  the job's block ({block_text(job)}): "
        f"{w['block_activation_bytes_per_layer'] / GB:,.2f} GB per layer",
        f"considered {len(plan.evaluated) + len(plan.invalid):,} layouts: {len(plan.ranked):,} "
        "feasible",
    ]
    framework_line = framework_text(job)
    if framework_line is not None:
        lines.insert(5, framework_line)
    if plan.capped_at is not None:
        lines.append(
            f"note: the search stopped at {plan.capped_at:,} layouts (--max-layouts), in the "
            "order tp, cp, pp ascending: the larger ones were not considered"
        )
    if not plan.evaluated:
        lines.append(
            "no layout can be built: "
            + (plan.invalid[0].reason if plan.invalid else "nothing to consider")
        )
        return "\n".join(lines) + "\n"
    if plan.no_fit is not None and len(plan.evaluated) > top:
        return "\n".join(lines + no_fit_lines(plan.no_fit)) + "\n"
    given = len(plan.evaluated) <= top
    shown = plan.evaluated if given else plan.meshes[:top]
    lines.append("")
    lines.append("   step      tokens/s   MFU    HFU   bubble         memory/GPU  layout")
    for e in shown:
        status = "" if e.feasible else f"  REJECTED: {e.rejected}"
        lines.append(
            f"  {e.step_s:8.3f} s {e.tokens_per_s:10.4g}  {e.mfu:5.1%}  {e.hfu:5.1%}  "
            f"{bubble_text(e.layout):13s}  {_gb(e.memory.total_bytes):>10s}  "
            f"{e.layout.key()}{status}"
        )
    for e in shown[:1] if given else plan.ranked[:1]:
        lines.append("")
        lines.append(f"{e.layout.key()}:")
        lines.append("  memory/GPU  " + memory_text(e.memory.as_dict(), e.memory.parts()))
        lines.append(
            f"  state/GPU   {_gb(e.memory.static_bytes)} (params + grads + optimizer)"
            f"  bubble {bubble_text(e.layout)}"
        )
        lines.append(
            "  step        "
            + "  ".join(
                f"{k.removesuffix('_s')} {v:.4g} s" for k, v in e.time.as_dict().items() if v
            )
        )
        lines.append(
            "  comm/step   " + "  ".join(f"{k} {_gb(v)}" for k, v in e.comm_bytes.items() if v)
            or "  comm/step   none"
        )
        lines += [f"  note        {note}" for note in e.notes]
    if plan.reasons:
        lines.append("")
        lines.append("why the first choice")
        for r in plan.reasons:
            lines.append(f"  {r.dimension}={r.value}  [{r.rule}]")
            lines.append(f"      {r.why}")
    if plan.misses:
        lines.append("")
        lines.append("near misses")
        for e, why in plan.misses:
            lines.append(f"  {e.layout.key()}: {why}")
    if plan.no_fit is not None:
        lines += no_fit_lines(plan.no_fit)
    return "\n".join(lines) + "\n"


def memory_text(categories: dict[str, float], parts: dict[str, float]) -> str:
    """`params 7.3 GB  grads 22.0 GB (fp32 14.7 GB)  ...  fragmentation 4.1 GB (reserve
    2.0 GB)`: the six categories (and total, if given), the framework's parts in theirs."""
    within = {"grads": ("fp32", parts.get("fp32_grads", 0.0))}
    within["fragmentation"] = ("reserve", parts.get("reserve", 0.0))
    shown = []
    for k, v in categories.items():
        name, part = within.get(k, ("", 0.0))
        shown.append(f"{k} {_gb(v)}" + (f" ({name} {_gb(part)})" if part else ""))
    return "  ".join(shown)


def no_fit_lines(nofit: NoFit) -> list[str]:
    """The least memory any layout needs, by category, against the budget; the nearest
    misses, the least over it first."""
    least, budget = nofit.least, nofit.budget_bytes
    categories = memory_text(
        {k: v for k, v in least.memory.as_dict().items() if k != "total"}, least.memory.parts()
    )
    floor = "  ".join(f"{k} {_gb(v)}" for k, v in nofit.floor_bytes.items())
    if nofit.fits_elsewhere:
        head = (
            f"no layout is feasible: the least memory any layout needs, "
            f"{_gb(least.memory.total_bytes)} per GPU, fits in {_gb(budget)}, but that layout "
            f"is rejected: {least.rejected}"
        )
    else:
        head = (
            f"no layout fits: the least memory any layout needs is "
            f"{_gb(least.memory.total_bytes)} per GPU against the device's {_gb(budget)} "
            f"({_gb(least.memory.total_bytes - budget)} over)"
        )
    lines = ["", head, f"  {least.layout.key()}:", f"    {categories}"]
    lines.append(f"  each category's least over every layout:  {floor}")
    if nofit.misses:
        lines.append(f"nearest misses (memory per GPU, over {_gb(budget)})")
        for e in nofit.misses:
            over = e.memory.total_bytes - budget
            lines.append(f"  {_gb(e.memory.total_bytes):>10s} (+{_gb(over)})  {e.layout.key()}")
    return lines
