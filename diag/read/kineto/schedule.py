"""The pipeline's micro-batches per step (m) and virtual stages per rank (v), read from how
many messages its stages exchange per step (issue 39).

What the counts mean. A pipeline of p stages runs each micro-batch's forward pass through
every stage and its backward pass back: per step, stage s sends m activations to s + 1 and
m gradients to s - 1 (1F1B and GPipe alike: the order differs, not the count). Interleaved
1F1B splits each rank's layers into v model chunks, the model being the v x p chunks in
order, so stage s's chunk c feeds chunk c on s + 1, and the last stage's chunk c feeds chunk
c + 1 on stage 0 (the wrap-around): per step every link between neighbours carries A = m x v
messages each way, and the link between the last stage and the first carries B = m x (v - 1)
each way (activations forward, gradients back). Megatron-LM issues them so
(`schedules.py`: `forward_backward_pipelining_with_interleaving`, with
`p2p_communication.py`'s `send_forward_recv_forward` to `(rank + 1) % p` and no send from
the last model chunk's output), whether batched through `batch_isend_irecv` or one by one.
So m = A - B and v = A / m.

What is counted: the sends and receives of the pipeline's groups, or of the world's (older
Megatron sends on the default group) or of none (an older trace's) where the pipeline is the
only axis that sends; not a context-parallel ring's, not a kernel no CPU op describes, not
the few-byte ones (Megatron's shape exchange before each message when sequence lengths vary,
SHAPE_EXCHANGE_BYTES); per traced rank and step. Sends in a group that is none of these (the
layout read a ring of two as the pipeline, and the pipeline's groups as nothing) leave m and
v unknown: which messages are the pipeline's is then not known. Counted:
- where the ops name their peers (`Dst Rank` / `Src Rank`): per link, A between neighbours,
  B between the last stage and the first, none between other stages;
- where they do not (an older PyTorch): per rank, its sends, 2A on a middle stage and A + B
  on the first or the last. Both are needed to separate A and B.
A count of A + B alone (two stages, or only the end stages traced without peers) is
m x (2v - 1): a power of two is m with v = 1 (2v - 1 is odd); another count could be several
(m, v), which the counts do not tell apart (unknown).

Whole steps only: the profiled window's first and last steps may be cut short, so with three
or more steps a rank's count is its inner steps', which must agree; with one or two, all of
them must. Counts that disagree (across steps, ranks, pipelines or links) leave m and v
unknown, saying where, never a default. A trace without ProfilerStep annotations is one step
of the whole trace: its counts are the trace's (a limit: several steps read as one).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from diag.contract import schema
from diag.contract.names import CP, PP
from diag.read.kineto.placement import FoundLayout

SHAPE_EXCHANGE_BYTES = 64
"""A message of at most this many bytes carries no activation: Megatron's shape exchange
(three int64 dimensions) ahead of each message when sequence lengths vary."""
READ = schema.SCHEDULE_READ
UNKNOWN = schema.SCHEDULE_UNKNOWN
SEND, RECV = schema.CollectiveOp.SEND.value, schema.CollectiveOp.RECV.value

Row = tuple[dict[str, Any], int]
"""A collective as `packed_comms.LayoutView.rows` holds it, and how often it occurred."""


@dataclass(frozen=True)
class Schedule:
    """m and v as read (None: unknown), and the evidence or why not."""

    microbatches: int | None
    virtual_stages: int | None
    why: str


@dataclass
class _Counts:
    """What the ranks' counts say of A (between neighbours), B (last to first stage) and
    A + B (a count that holds both), each value with where it came from."""

    a: dict[int, str] = dataclasses.field(default_factory=dict)
    b: dict[int, str] = dataclasses.field(default_factory=dict)
    a_plus_b: dict[int, str] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    peers_named: bool = False


def with_schedule(
    found: FoundLayout,
    given: schema.Layout | None,
    rows: Iterable[Row],
    steps: list[dict[str, Any]],
) -> FoundLayout:
    """The found layout with its micro-batches and virtual stages: the given ones (`--layout
    m=,v=`), else read from the traces (`read_schedule`); the layout source says which, or
    why they are unknown (they stay 1 then, a placeholder `schedule_known` disowns). A given
    m without v reads v, or takes 1 (a schedule without interleaving, every framework's
    default) where the traces do not say it."""
    layout = found.layout
    given_m = given.microbatches if given is not None else 0
    given_v = given.virtual_stages if given is not None else 0
    if (layout.pp or 1) < 2 or found.source.startswith(schema.UNKNOWN_LAYOUT):
        return _placed(found, given_m or 1, given_v or 1, None)
    if given_m and given_v:
        return _placed(found, given_m, given_v, None)
    groups = found.groups.get(PP) or []
    rings = found.groups.get(CP) or []
    read = read_schedule(rows, steps, groups, layout.cp or 1, rings)
    m, v = given_m or read.microbatches, given_v or read.virtual_stages
    if given_m and v is None:
        return _placed(found, given_m, 1, None)
    if m is None or v is None:
        return _placed(found, m or 1, v or 1, f"{UNKNOWN}{read.why}")
    return _placed(found, m, v, f"{READ}m={m}, v={v} ({read.why})")


def _placed(found: FoundLayout, m: int, v: int, text: str | None) -> FoundLayout:
    return found.replaced(text, microbatches=m, virtual_stages=v)


def read_schedule(
    rows: Iterable[Row],
    steps: list[dict[str, Any]],
    groups: list[list[int]],
    cp: int = 1,
    rings: list[list[int]] | None = None,
) -> Schedule:
    """m and v of the pipeline whose groups (`groups`: each pipeline's ranks by stage) are
    given, from the sends and receives among `rows` and each rank's `steps` (step records)."""
    if not groups or len(groups[0]) < 2:
        return Schedule(None, None, "no pipeline groups")
    p = len(groups[0])
    stage_of = {rank: (i, s) for i, group in enumerate(groups) for s, rank in enumerate(group)}
    members = {tuple(sorted(group)) for group in groups}
    known = members | {tuple(sorted(group)) for group in rings or []}
    if isinstance(rows, Iterator):  # read twice below: held only where it cannot be re-read
        rows = list(rows)
    other = _other_group(rows, known, len(stage_of))
    if other is not None:  # a pipeline the layout did not place (a ring of two read as one)
        why = f"sends and receives in a group of ranks {list(other)}, neither the pipeline's "
        return Schedule(None, None, why + "nor a ring's, may be the pipeline's")
    ops, peers_unknown = _ops(rows, stage_of, members, cp)
    if not ops:
        return Schedule(None, None, "no sends or receives between pipeline stages in the traces")
    windows: dict[int, list[int]] = defaultdict(list)
    for step in steps:
        windows[int(step["rank"])].append(int(step["step"]))
    counts = _Counts(peers_named=not peers_unknown)
    for rank in sorted(ops):
        steps_of = sorted(set(windows.get(rank, [])))
        if steps_of:
            _observe(rank, stage_of[rank][1], p, ops[rank], steps_of, rank in peers_unknown,
                     counts)  # fmt: skip
    return _solved(counts, p)


def _other_group(
    rows: Iterable[Row], known: set[tuple[int, ...]], world: int
) -> tuple[int, ...] | None:
    """The ranks of a group, neither the pipeline's nor context parallel's nor the world's,
    whose sends and receives a CPU op describes, if any."""
    for row, _ in rows:
        ranks = row.get("group_ranks")
        if ranks is not None and len(ranks) >= world:
            continue
        if row.get("op") in (SEND, RECV) and not row.get("from_name") and ranks is not None:
            members = tuple(sorted(ranks))
            if members not in known:
                return members
    return None


def _ops(
    rows: Iterable[Row],
    stage_of: dict[int, tuple[int, int]],
    members: set[tuple[int, ...]],
    cp: int,
) -> tuple[dict[int, Counter[tuple[int, str, int | None]]], set[int]]:
    """Per rank, (step, op, peer's stage or None) -> ops, of the pipeline's sends and receives;
    and the ranks some of whose ops do not name a peer in their pipeline (counted per rank)."""
    ops: dict[int, Counter[tuple[int, str, int | None]]] = defaultdict(Counter)
    unnamed: set[int] = set()
    for row, count in rows:
        op, rank = row.get("op"), row.get("rank")
        if op not in (SEND, RECV) or row.get("from_name") or type(rank) is not int:
            continue
        if rank not in stage_of:
            continue
        size = row.get("bytes")
        if isinstance(size, int | float) and 0 < size <= SHAPE_EXCHANGE_BYTES:
            continue
        ranks = row.get("group_ranks")
        if ranks is not None and len(ranks) >= len(stage_of):
            ranks = None  # the world's (older Megatron sends on the default group): by peer
        if ranks is not None and tuple(sorted(ranks)) not in members:
            continue  # another group's (a context-parallel ring's)
        if ranks is None and cp > 1:
            continue  # a ring's or the pipeline's: nothing says which
        pipeline, _ = stage_of[rank]
        peer = row.get("peer")
        there = stage_of.get(peer) if type(peer) is int else None
        if there is None or there[0] != pipeline:
            unnamed.add(rank)
        ops[rank][(int(row.get("step") or 0), str(op), there[1] if there else None)] += count
    return ops, unnamed


def _per_step(
    by_step: dict[int, int], rank: int, steps: list[int], op: str
) -> tuple[int | None, str]:
    """The rank's count per whole step (`by_step`: step -> ops): its inner steps' where it
    has three or more (the first and last may be cut short), else every step's; None where
    they differ, with the counts."""
    counts = [by_step.get(step, 0) for step in steps]
    whole = counts[1:-1] if len(counts) >= 3 else counts
    if len(set(whole)) == 1:
        return whole[0], ""
    shown = ", ".join(f"step {s}: {n}" for s, n in zip(steps, counts, strict=True))
    return None, f"rank {rank}'s {_word(op)} per step differ ({shown})"


def _word(op: str) -> str:
    return "sends" if op == SEND else "receives"


def _observe(
    rank: int,
    stage: int,
    p: int,
    mine: Counter[tuple[int, str, int | None]],
    steps: list[int],
    unnamed: bool,
    counts: _Counts,
) -> None:
    """What the rank's counts (`mine`: (step, op, peer's stage) -> ops) say of A, B and
    A + B (the module's docstring)."""
    by_link: dict[tuple[str, int | None], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for (step, op, peer), ops in mine.items():
        by_link[(op, None if unnamed else peer)][step] += ops
    # the links the schedule may use from this stage, and any other the ops name
    others = {stage - 1, stage + 1} | ({0, p - 1} if stage in (0, p - 1) else set())
    others |= {peer for _, peer in by_link if peer is not None}
    others = {other for other in others if 0 <= other < p and other != stage}
    for op in (SEND, RECV):
        if unnamed:  # its sends (receives) to both neighbours together
            n, problem = _per_step(by_link.get((op, None), {}), rank, steps, op)
            if n is None:
                counts.problems.append(problem)
            elif p == 2 or stage in (0, p - 1):
                counts.a_plus_b.setdefault(n, f"{n} {_word(op)} per step on stage {stage}")
            elif n % 2:
                counts.problems.append(f"stage {stage}'s {n} {_word(op)} per step are odd")
            else:
                counts.a.setdefault(n // 2, f"{n} {_word(op)} per step on stage {stage}")
            continue
        for other in sorted(others):
            n, problem = _per_step(by_link.get((op, other), {}), rank, steps, op)
            where = (f"{n} sends per step from stage {stage} to stage {other}" if op == SEND
                     else f"{n} receives per step on stage {stage} from stage {other}")  # fmt: skip
            if n is None:
                counts.problems.append(problem)
            elif p == 2:
                counts.a_plus_b.setdefault(n, where)
            elif abs(stage - other) == 1:
                counts.a.setdefault(n, where)
            elif {stage, other} == {0, p - 1}:
                counts.b.setdefault(n, where)
            elif n:
                counts.problems.append(f"{where}, which are not neighbours")


def _solved(counts: _Counts, p: int) -> Schedule:
    """m and v from the counts' A, B and A + B, where they agree and say them."""
    if counts.problems:
        return Schedule(None, None, counts.problems[0])
    for name, values in (("between neighbouring stages", counts.a),
                         (f"between stages {p - 1} and 0", counts.b),
                         ("on the pipeline's ends", counts.a_plus_b)):  # fmt: skip
        if len(values) > 1:
            return Schedule(None, None, f"the counts {name} disagree: " + "; ".join(
                values[n] for n in sorted(values)))  # fmt: skip
    a = next(iter(counts.a), None)
    b = next(iter(counts.b), None)
    both = next(iter(counts.a_plus_b), None)
    if a is not None and b is None and both is not None:
        b = both - a
    if a is not None and b is not None:
        if both is not None and both != a + b:
            return Schedule(None, None, f"{counts.a[a]} and {counts.a_plus_b[both]} disagree")
        m = a - b
        if a == 0 or m < 1 or a % m:
            return Schedule(None, None, f"{_said(counts, a, b, both)}: no m and v give them")
        return Schedule(m, a // m, _said(counts, a, b, both))
    if both is not None:  # m x (2v - 1): a power of two is m itself
        if both > 0 and both & (both - 1) == 0:
            return Schedule(both, 1, f"{counts.a_plus_b[both]}, m x (2v - 1) with 2v - 1 odd")
        return Schedule(None, None, f"{counts.a_plus_b[both]} is m x (2v - 1), several m and v "
                                    "(no trace of a middle stage separates them)")  # fmt: skip
    if a is not None:
        return Schedule(None, None, f"{counts.a[a]} are m x v (no trace of the first or last "
                                    "stage separates them)")  # fmt: skip
    return Schedule(None, None, "no traced rank of the pipeline sends or receives")


def _said(counts: _Counts, a: int, b: int, both: int | None) -> str:
    """The evidence, in words."""
    text = counts.a[a]
    if b in counts.b:
        text += f", {counts.b[b]}" if b else ", none between the last stage and the first"
    elif both is not None:
        text += f", {counts.a_plus_b[both]}"
    return text
