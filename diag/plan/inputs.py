"""Every input of `diag plan` checked in one place, before anything is enumerated: the
model's shape, the batch, the cluster, each pinned layout and the search's bounds.

The rules `diag simulate` applies too (a model's shape, a ZeRO stage, a device) are
diag.contract.input_rules's; this module names the plan's option for each (`--kv-heads`, `--zero`,
`--memory-gb`) and adds the plan's own (the global batch in micro-batches, a layout's divisibility,
the search bounds). A refusal is `PlanError`: the project's InputError (one line, "OPTION: reason";
the CLI prints it and exits 2) and a ValueError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from diag.contract.input_rules import (
    RuleError,
    check_counts,
    check_device,
    check_model,
    check_zero_stage,
)
from diag.errors import InputError
from diag.plan.frameworks import Framework
from diag.plan.job import RECOMPUTE, Cluster, Job, Layout
from diag.plan.search import SearchSpace, structural_problem


class PlanError(InputError, ValueError):
    """A job, cluster, layout or search bound that cannot be planned: `path` is the option
    (`--kv-heads`), `reason` why; `str()` is one line, "OPTION: reason"."""


OPTIONS = {
    "layers": "--layers",
    "hidden": "--hidden",
    "heads": "--heads",
    "kv_heads": "--kv-heads",
    "ffn_hidden": "--ffn-hidden",
    "vocab": "--vocab",
    "seq_len": "--seq",
    "experts": "--experts",
    "topk": "--topk",
    "micro_batch": "--micro-batch",
    "device_memory_gb": "--memory-gb",
    "device_tflops": "--peak-tflops",
    "intra_node_GBps": "--intra-node-GBps",
    "inter_node_GBps": "--inter-node-GBps",
    "mfu": "--compute-efficiency",
    "zero_stage": "--zero",
}
"""A shared rule's field -> the plan's option that sets it (others keep the field's name)."""


def _as_option(err: RuleError) -> PlanError:
    return PlanError(OPTIONS.get(err.field, err.field), err.reason)


def check_inputs(
    job: Job, cluster: Cluster, layouts: Sequence[Layout] = (), space: SearchSpace | None = None
) -> None:
    """PlanError naming the option of the first input the plan cannot use, else None."""
    try:
        check_model(job.model)
        check_device(cluster.hardware)
    except RuleError as err:
        raise _as_option(err) from None
    for option, value in (("--gpus", cluster.gpus), ("--gpus-per-node", cluster.gpus_per_node)):
        if value < 1:
            raise PlanError(option, f"must be a whole number >= 1, got {value}")
    for layout in layouts:  # before the batch: a layout's m=0 is what makes a batch of 0
        check_layout_values(layout)
    _check_batch(job)
    for layout in layouts:
        problem = structural_problem(job, layout, cluster.gpus)
        if problem is not None:
            raise PlanError("--layout", f"{layout.key()}: {problem}")
    if space is not None:
        check_space(space)
        check_framework_space(space, job.framework)


def _check_batch(job: Job) -> None:
    for option, value in (("--global-batch", job.global_batch), ("--micro-batch", job.micro_batch)):
        if value < 1:
            raise PlanError(option, f"must be a whole number >= 1, got {value}")
    if job.global_batch % job.micro_batch:
        raise PlanError(
            "--global-batch",
            f"{job.global_batch} sequences are not a whole number of micro-batches of "
            f"{job.micro_batch} (--micro-batch)",
        )
    if job.params is not None and not (job.params > 0 and math.isfinite(job.params)):
        raise PlanError("--params", f"must be a finite number > 0, got {job.params}")


def check_layout_values(layout: Layout) -> None:
    """A pinned layout (`--layout`): whole sizes >= 1, a ZeRO stage, a recomputation (that
    it can be built for the job is `structural_problem`, the search's rules)."""
    sizes = {"dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "cp": layout.cp}
    sizes |= {"ep": layout.ep, "m": layout.microbatches, "v": layout.v}
    try:
        check_counts(sizes)
        check_zero_stage(layout.zero)
    except RuleError as err:
        field = "zero" if err.field == "zero_stage" else err.field
        raise PlanError("--layout", f"{layout.key()}: {field} {err.reason}") from None
    if layout.recompute not in RECOMPUTE:
        raise PlanError(
            "--layout", f"{layout.key()}: recompute must be one of {', '.join(RECOMPUTE)}"
        )


def check_space(space: SearchSpace) -> None:
    """The search's bounds: stages and recomputations that exist, limits >= 1."""
    if not space.zero_stages:
        raise PlanError("--zero", "give at least one ZeRO stage")
    for stage in space.zero_stages:
        try:
            check_zero_stage(stage)
        except RuleError as err:
            raise _as_option(err) from None
    if not space.recompute:
        raise PlanError("--recompute", "give at least one of none, selective, full")
    for recompute in space.recompute:
        if recompute not in RECOMPUTE:
            raise PlanError("--recompute", f"{recompute!r} is not one of {', '.join(RECOMPUTE)}")
    limits = {"--max-v": space.max_v, "--max-cp": space.max_cp}
    limits |= {"--max-layouts": space.max_layouts}
    pins = {"tp": space.tp, "pp": space.pp, "dp": space.dp}
    limits |= {k: v for k, v in pins.items() if v is not None}
    for option, value in limits.items():
        if value < 1:
            raise PlanError(option, f"must be a whole number >= 1, got {value}")


def check_framework_space(space: SearchSpace, framework: Framework) -> None:
    """What the search may use is what `framework` runs (`--framework`): a ZeRO stage, a
    recomputation, interleaving, CP, sequence parallelism or a pipeline it lacks is refused."""
    name = f"{framework.key} ({framework.name})"
    for stage in space.zero_stages:
        if stage not in framework.zero_stages:
            stages = ", ".join(map(str, framework.zero_stages))
            raise PlanError("--zero", f"{stage}: {name} runs ZeRO {stages}")
    for recompute in space.recompute:
        if recompute not in framework.recompute:
            offered = ", ".join(framework.recompute)
            raise PlanError("--recompute", f"{recompute}: {name} offers {offered}")
    limits = [("--max-v", space.max_v, framework.max_v, "interleaved virtual stages")]
    limits += [("--max-cp", space.max_cp, framework.max_cp, "context-parallel ranks")]
    for option, value, most, what in limits:
        if value > most:
            raise PlanError(option, f"{value}: {name} runs at most {most} {what}")
    if space.sequence_parallel and not framework.sequence_parallel:
        raise PlanError("--sequence-parallel", f"on: {name} has no sequence parallelism")
    if not framework.pipeline_zero and space.pp not in (None, 1):
        raise PlanError("pp", f"{space.pp}: {framework.pipeline_refusal}")
