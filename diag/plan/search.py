"""Enumerate the layouts of a job on a cluster: every combination that can be built, and for
the rest the reason it cannot (divisibility), with the limits that keep the search small:
the pipeline sizes are the divisors of what remains after tp and cp (from its prime factors,
diag.plan.divisors) up to the layers, and `SearchSpace.max_layouts` caps how many layouts one
search enumerates (make_plan says so when it cuts the search)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from diag.contract.input_rules import tp_split_problem
from diag.plan.divisors import divisors
from diag.plan.frameworks import Framework
from diag.plan.job import RECOMPUTE, Cluster, Job, Layout
from diag.plan.pipeline import stage_count_problem

MAX_LAYOUTS = 20_000
"""Layouts one search enumerates at most (buildable or not): at the 0.3-0.5 ms a layout takes
to evaluate, under 10 s on one core; the widest preset searches (Mixtral on 64 GPUs, Llama 3
405B on 16,384) enumerate under 9,000."""
MAX_VIRTUAL_STAGES = 8
CP_SIZES = (1, 2, 4, 8)
FLASH_IS_SELECTIVE = (
    "selective recomputation is what flash attention does already (the scores are never kept)"
)


@dataclass(frozen=True)
class SearchSpace:
    """What the search may choose: a framework's limits (Megatron-LM 2021 had no ZeRO) or a
    user's pins (`--tp 8`). None: any value."""

    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    max_v: int = MAX_VIRTUAL_STAGES
    max_cp: int = max(CP_SIZES)
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    max_layouts: int = MAX_LAYOUTS
    sequence_parallel: bool = True
    """Sequence parallelism with tp > 1 (Korthikanti 2022); off for frameworks before it."""


def framework_space(framework: Framework, **given: Any) -> SearchSpace:
    """The search space `framework` offers (its ZeRO stages, recomputation, interleaving, CP
    and sequence parallelism; pp = 1 without a pipeline schedule), `given` fields over it
    (diag.plan.inputs refuses one the framework does not run)."""
    offered = SearchSpace(
        zero_stages=framework.zero_stages,
        recompute=framework.recompute,
        max_v=framework.max_v,
        max_cp=framework.max_cp,
        pp=None if framework.pipeline_zero else 1,
        sequence_parallel=framework.sequence_parallel,
    )
    return replace(offered, **given)


@dataclass(frozen=True)
class Invalid:
    """A combination that cannot be built, and why."""

    layout: Layout
    reason: str


def structural_problem(job: Job, layout: Layout, gpus: int) -> str | None:
    """Why `layout` cannot be built for `job` on `gpus` GPUs, or None."""
    m = job.model
    if layout.world != gpus:
        return f"dp x tp x pp x cp = {layout.world}, not the {gpus} GPUs"
    tp_problem = tp_split_problem(m, layout.tp)
    if tp_problem is not None:
        return tp_problem
    if m.seq_len % layout.cp:
        return f"cp={layout.cp} does not divide seq ({m.seq_len})"
    if layout.ep > 1 and (not m.experts or m.experts % layout.ep or layout.dp % layout.ep):
        return f"ep={layout.ep} must divide the experts ({m.experts}) and dp ({layout.dp})"
    stage_problem = stage_count_problem(m.layers, layout.pp, layout.v)
    if stage_problem is not None:
        return stage_problem
    per_step = layout.dp * job.micro_batch * layout.microbatches
    if per_step != job.global_batch:
        return (
            f"global batch {job.global_batch} is not dp ({layout.dp}) x micro-batch "
            f"({job.micro_batch}) x m"
        )
    if layout.v > 1 and layout.pp == 1:
        return f"v={layout.v} interleaves pipeline stages: it needs pp > 1"
    if layout.v > 1 and layout.microbatches % layout.pp:
        return f"interleaving needs m ({layout.microbatches}) divisible by pp ({layout.pp})"
    if layout.zero and layout.dp == 1:
        return "ZeRO needs dp > 1"
    return None


def candidates(
    job: Job, cluster: Cluster, space: SearchSpace | None = None
) -> Iterator[Layout | Invalid]:
    """Every layout of the search space: valid ones as `Layout`, the rest as `Invalid`.

    tp: powers of two up to twice a node (the ones across nodes are kept to say why they
    lose), cp up to 8, pp every divisor of what remains up to the layers, dp the rest;
    micro-batches from the global batch; v up to 8; ZeRO 0-3; recomputation none / selective
    / full (not selective with flash attention, which recomputes the scores itself); ep the
    divisors of the experts up to the GPUs. Unbounded: make_plan takes `space.max_layouts`."""
    space = space or SearchSpace()
    gpus, model = cluster.gpus, job.model
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= 2 * cluster.gpus_per_node and t <= gpus]
    tps = [space.tp] if space.tp is not None else tps
    eps = list(divisors(model.experts, gpus)) if model.experts else [1]
    for tp in tps:
        for cp in (c for c in CP_SIZES if c <= space.max_cp):
            if gpus % (tp * cp):
                continue
            for pp in divisors(gpus // (tp * cp), model.layers):
                dp = gpus // (tp * cp * pp)
                if space.pp not in (None, pp) or space.dp not in (None, dp):
                    continue
                if job.global_batch % (dp * job.micro_batch):
                    yield Invalid(
                        Layout(dp, tp, pp, cp),
                        f"global batch {job.global_batch} "
                        f"not divisible by dp ({dp}) x micro-batch ({job.micro_batch})",
                    )
                    continue
                m = job.global_batch // (dp * job.micro_batch)
                base = Layout(dp, tp, pp, cp, microbatches=m)
                yield from _variants(job, base, eps, gpus, space)


def _variants(
    job: Job, base: Layout, eps: list[int], gpus: int, space: SearchSpace
) -> Iterator[Layout | Invalid]:
    vs = [v for v in (1, 2, 4, 8) if (base.pp > 1 or v == 1) and v <= space.max_v]
    zeros = [z for z in space.zero_stages if base.dp > 1 or z == 0] or [0]
    for ep in eps:
        for v in vs:
            for zero in zeros:
                for recompute in space.recompute:
                    layout = Layout(
                        base.dp,
                        base.tp,
                        base.pp,
                        base.cp,
                        ep,
                        zero,
                        base.microbatches,
                        v,
                        recompute,
                        sequence_parallel=space.sequence_parallel,
                    )
                    problem = structural_problem(job, layout, gpus)
                    if recompute == "selective" and job.training.flash_attention:
                        problem = problem or FLASH_IS_SELECTIVE
                    yield layout if problem is None else Invalid(layout, problem)
