"""Why the first choice: which rule of the seed's selection guide chose each dimension, held
against the layouts that differ from it in that dimension alone; and why the near misses lose.

The rules (docs/physics.md: the layout rule, the pitfalls, choosing a layout): TP (and EP) inside a
node (pitfall 1 when not); PP across nodes for what does not fit after TP; DP over what remains; m
>= 4p and interleaving against the bubble (pitfall 2); ZeRO when the pressure is state;
recomputation (or CP) when it is activations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diag.plan.evaluate import GB, PIPELINE_ENGINE_NOTE, Evaluation
from diag.plan.job import Layout

RULES: dict[str, str] = {
    "tp": "TP inside a node (3D layout rule; pitfall 1 across nodes)",
    "cp": "CP for activation-bound long sequences",
    "ep": "EP inside a node, for the experts",
    "pp": "PP across nodes for what does not fit after TP",
    "dp": "DP over what remains: world / (TP x CP x PP)",
    "v": "interleaved 1F1B divides the bubble by v (pitfall 2: too few micro-batches)",
    "zero": "state-bound: ZeRO shards parameters, gradients, optimizer state over DP",
    "recompute": "activation-bound: recompute (selective first, full when needed)",
}
"""Dimension -> the rule that decides it."""

COMPONENTS = {
    "compute_s": "compute",
    "tp_s": "TP communication",
    "cp_s": "CP communication",
    "ep_s": "EP all-to-all",
    "zero_s": "ZeRO parameter gathers",
    "pp_bubble_s": "pipeline bubble",
    "pp_p2p_s": "pipeline transfers",
    "dp_s": "exposed DP gradient reduction",
    "optimizer_s": "optimizer",
    "overhead_s": "host overhead",
}


@dataclass(frozen=True)
class Reason:
    dimension: str
    value: str
    rule: str
    why: str


def _value(layout: Layout, dimension: str) -> str:
    return str(getattr(layout, dimension))


def _same_but(a: Layout, b: Layout, dimension: str) -> bool:
    """b differs from a in `dimension` (and in what follows from it: dp, m) and nothing else."""
    fixed = {"tp", "cp", "pp", "ep", "v", "zero", "recompute"} - {dimension}
    if dimension in ("tp", "cp", "pp"):
        fixed -= {"zero", "recompute", "v"}  # re-fitting memory may need another choice
    return getattr(a, dimension) != getattr(b, dimension) and all(
        getattr(a, f) == getattr(b, f) for f in fixed
    )


def loss_line(best: Evaluation, other: Evaluation, named: bool = True) -> str:
    """Why `other` loses to `best`: its rejection, or how much slower (naming its layout in
    full unless the caller shows it: `named`) and by which causes, largest first."""
    if other.rejected is not None:
        if other.rejected_kind == "crosses-nodes":
            ratio = other.step_s / best.step_s
            if ratio >= 1.1:
                return f"{other.rejected}, predicted {ratio:.1f}x slower"
            return f"{other.rejected} (predicted {ratio:.2f}x the step: the rule rejects it)"
        if other.step_s < best.step_s:
            faster = best.step_s / other.step_s - 1
            return f"{other.rejected} (would be {faster:.1%} faster)"
        return other.rejected
    ratio = other.step_s / best.step_s - 1
    mine, theirs = _by_cause(best), _by_cause(other)
    grown = sorted(
        (k for k in theirs if theirs[k] - mine[k] >= SHOWN_SHARE * best.step_s),
        key=lambda k: mine[k] - theirs[k],
    )[:MAX_CAUSES] or [max(theirs, key=lambda k: theirs[k] - mine[k])]
    parts = []
    for cause in grown:
        part = f"{CAUSES[cause]} +{_seconds(theirs[cause] - mine[cause])}"
        if cause == "pp_bubble_s":
            part += f" (bubble {other.bubble_fraction:.0%} vs {best.bubble_fraction:.0%})"
        parts.append(part)
    layout = f" ({other.layout.key()})" if named else ""
    line = f"{ratio:.1%} slower{layout}: {', '.join(parts)}"
    if ratio < 0.005:
        spare = (best.memory.total_bytes - other.memory.total_bytes) / GB
        line = f"ties on time ({ratio:+.1%}); {'less' if spare > 0 else 'more'} memory"
    return line


SHOWN_SHARE = 0.01
"""A cause is named in a loss line when it grows by at least this share of the best step."""
MAX_CAUSES = 3
CAUSES = {**COMPONENTS, "recompute_s": "recomputation"}
"""The step's components, the recomputation apart from the model's compute."""


def _by_cause(evaluation: Evaluation) -> dict[str, float]:
    """The step's seconds by cause: its components, with the compute split into the model's
    and the recomputation's (in the ratio of their FLOPs: HFU counts both, MFU the model's)."""
    parts = evaluation.time.as_dict()
    recomputed = 1 - evaluation.mfu / evaluation.hfu if evaluation.hfu > 0 else 0.0
    parts["recompute_s"] = parts["compute_s"] * recomputed
    parts["compute_s"] -= parts["recompute_s"]
    return parts


def _seconds(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"


def reasoning(
    best: Evaluation,
    every: Sequence[Evaluation],
    gpus_per_node: int,
    static_bytes: float,
    budget_bytes: float,
) -> list[Reason]:
    """One reason per dimension of `best`: the rule, and the alternatives it beat."""
    lay = best.layout
    fits = static_bytes <= budget_bytes
    state = (
        f"the state ({static_bytes / GB:,.0f} GB at 16 B/param) "
        f"{'fits' if fits else 'does not fit'} one GPU ({budget_bytes / GB:.0f} GB)"
    )
    out = []
    for dim in ("tp", "pp", "cp", "ep", "v", "zero", "recompute"):
        alternatives = [e for e in every if _same_but(lay, e.layout, dim)]
        if dim in ("cp", "ep", "v") and getattr(lay, dim) == 1 and not alternatives:
            continue
        why = [_alternative(best, alternatives, dim, value) for value in _neighbours(lay, dim)]
        text = "; ".join(w for w in why if w)
        if dim == "tp":
            text = f"{state}; " + (text or "no other TP size can be built")
        notes = [note for note in best.notes if _note_dimension(note) == dim]
        if notes:
            text = "; ".join([*notes, text] if text else notes)
        if dim == "pp" and lay.pp > 1:
            met = "met" if lay.microbatches >= 4 * lay.pp else "not met"
            text += ("; " if text else "") + f"m = {lay.microbatches} micro-batches: m >= 4p {met}"
        out.append(Reason(dim, _value(lay, dim), RULES[dim], text or "the only choice"))
    out.append(
        Reason(
            "dp",
            str(lay.dp),
            RULES["dp"],
            f"{lay.world} GPUs / (TP {lay.tp} x CP {lay.cp} x PP {lay.pp})",
        )
    )
    return out


def _neighbours(layout: Layout, dim: str) -> list[object]:
    value = getattr(layout, dim)
    if dim == "recompute":
        return [r for r in ("none", "selective", "full") if r != value]
    if dim == "zero":
        return [z for z in (0, 1, 2, 3) if z != value]
    return [value // 2, value * 2] if value > 1 else [value * 2]


def _alternative(
    best: Evaluation, alternatives: Sequence[Evaluation], dim: str, value: object
) -> str:
    same = [e for e in alternatives if getattr(e.layout, dim) == value]
    if not same:
        return ""
    # the alternative's best version: a feasible one if any, else the fastest
    pick: Callable[[Evaluation], tuple[bool, float]] = lambda e: (not e.feasible, e.step_s)  # noqa: E731
    other = min(same, key=pick)
    return f"{dim}={value}: {loss_line(best, other)}"


def near_misses(
    best: Evaluation, ranked: Sequence[Evaluation], every: Sequence[Evaluation], count: int = 3
) -> list[tuple[Evaluation, str]]:
    """The runners-up and, for each kind of rejection, its fastest layout, with why they lose."""
    out = [(e, loss_line(best, e, named=False)) for e in ranked[1 : 1 + count]]
    for kind in ("crosses-nodes", "framework", "memory"):
        rejected = [e for e in every if e.rejected_kind == kind]
        if rejected:
            fastest = min(rejected, key=lambda e: e.step_s)
            out.append((fastest, loss_line(best, fastest, named=False)))
    return out


def _note_dimension(note: str) -> str:
    """The dimension a layout's note is about: ZeRO's (the pipeline engine) or EP's (the
    all-to-all across nodes)."""
    return "zero" if note == PIPELINE_ENGINE_NOTE else "ep"
