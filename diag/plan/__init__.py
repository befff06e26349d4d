"""`diag plan`: which layout, why, and what it will cost, before the job runs (docs/plan.md).

    from diag.plan import cluster_from_device, make_plan
    from diag.plan.models import preset_job
    plan = make_plan(preset_job("llama3-70b", global_batch=512), cluster_from_device(h100, 64))
    plan.ranked[0].layout, plan.reasons

Pure functions over the job, the cluster and the layouts: model presets and how their papers
trained them (`models`), the search (`search`), one block's activations (`activations`), the
pipeline split and each stage's peak in flight (`pipeline`), what each framework runs and
keeps (`frameworks`), memory per GPU in the six categories (`memory`), step time in the
simulator's cost model (`timing`), the evaluation of one layout (`evaluate`), the seed's
reasoning and the near misses (`reasons`), what to say when nothing fits (`nofit`), every input
checked before the search (`inputs`), the calibration from a measured run (`calibrate`), and
the text and JSON renderings (`render`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from diag.contract import ledger
from diag.plan.evaluate import Evaluation, evaluate
from diag.plan.frameworks import FRAMEWORKS, GENERIC, Framework
from diag.plan.inputs import PlanError, check_inputs
from diag.plan.job import Cluster, Job, Layout, cluster_from_device
from diag.plan.nofit import NoFit, no_fit
from diag.plan.reasons import Reason, near_misses, reasoning
from diag.plan.search import Invalid, SearchSpace, candidates, framework_space

__all__ = [
    "FRAMEWORKS",
    "GENERIC",
    "Cluster",
    "Evaluation",
    "Framework",
    "Job",
    "Layout",
    "NoFit",
    "Plan",
    "PlanError",
    "SearchSpace",
    "cluster_from_device",
    "framework_space",
    "make_plan",
]


@dataclass(frozen=True)
class Plan:
    job: Job
    cluster: Cluster
    ranked: list[Evaluation]  # feasible layouts, fastest first
    evaluated: list[Evaluation]  # every buildable layout, feasible or rejected
    invalid: list[Invalid]  # combinations that cannot be built
    reasons: list[Reason] = field(default_factory=list)
    misses: list[tuple[Evaluation, str]] = field(default_factory=list)
    capped_at: int | None = None  # the search stopped at this many layouts (max_layouts)
    no_fit: NoFit | None = None  # when nothing is feasible: the least memory, nearest misses

    @property
    def best(self) -> Evaluation | None:
        return self.ranked[0] if self.ranked else None

    @property
    def static_bytes(self) -> float:
        """16 B/param of the whole model (SEED §1)."""
        return plan_static_bytes(self.job)

    def find(self, layout: Layout) -> Evaluation | None:
        return next((e for e in self.evaluated if e.layout == layout), None)

    @property
    def meshes(self) -> list[Evaluation]:
        """The fastest feasible variant of each mesh (dp, tp, pp, cp, ep), fastest first: the
        layouts as a paper reports them (ZeRO stage, v and recomputation are its settings)."""
        seen: set[tuple[int, ...]] = set()
        out = []
        for e in self.ranked:
            mesh = (e.layout.dp, e.layout.tp, e.layout.pp, e.layout.cp, e.layout.ep)
            if mesh not in seen:
                seen.add(mesh)
                out.append(e)
        return out


def make_plan(
    job: Job,
    cluster: Cluster,
    layouts: Sequence[Layout] | None = None,
    space: SearchSpace | None = None,
) -> Plan:
    """Evaluate `layouts` (default: the search space, at most `space.max_layouts` of it) and
    rank the feasible ones by predicted throughput. `space` defaults to what the job's
    framework offers (`framework_space`). PlanError (one line naming the option) for an input
    that cannot be planned, a given layout that cannot be built among them."""
    space = space or framework_space(job.framework)
    check_inputs(job, cluster, layouts or (), space)
    evaluated: list[Evaluation] = []
    invalid: list[Invalid] = []
    capped_at = None
    if layouts is None:
        for count, item in enumerate(candidates(job, cluster, space)):
            if count == space.max_layouts:
                capped_at = count
                break
            if isinstance(item, Invalid):
                invalid.append(item)
            else:
                evaluated.append(evaluate(job, item, cluster))
    else:
        evaluated = [evaluate(job, layout, cluster) for layout in layouts]
    ranked = sorted(
        (e for e in evaluated if e.feasible), key=lambda e: (e.step_s, e.memory.total_bytes)
    )
    if not ranked:
        missing = no_fit(evaluated, cluster.memory_bytes)
        return Plan(job, cluster, ranked, evaluated, invalid, capped_at=capped_at, no_fit=missing)
    best = ranked[0]
    reasons = reasoning(
        best, evaluated, cluster.gpus_per_node, plan_static_bytes(job), cluster.memory_bytes
    )
    misses = near_misses(best, ranked, evaluated)
    return Plan(job, cluster, ranked, evaluated, invalid, reasons, misses, capped_at)


def plan_static_bytes(job: Job) -> float:
    """16 B/param of the whole model (SEED §1)."""
    return ledger.static_state_bytes(job.total_params)
