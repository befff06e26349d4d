"""Which parsed traces are the run's ranks (`assign_ranks`): each trace's rank, one profiled
window per rank (a repeating profiler schedule writes several), and the ranks whose step
numbers meet the others'; what is left out, or cannot be read as the traces say, is noted."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

from diag.contract.rank_text import ranks_phrase
from diag.errors import InputError
from diag.read.kineto.files import ParsedTrace


def assign_ranks(folder: Path, parsed: list[ParsedTrace], skipped: list[str]) -> list[ParsedTrace]:
    """The usable traces by rank. Unreadable files are skipped with a note; InputError when
    none is left, when ranks cannot be told, or when two files claim one rank."""
    usable, errors = [], []
    for trace in parsed:
        if trace.error:
            skipped.append(f"{trace.error} (file skipped)")
            errors.append(trace.error)
        else:
            usable.append(trace)
            skipped += trace.notes
    unknown = [t for t in usable if t.rank is None]
    known = [t for t in usable if t.rank is not None]
    if unknown and (known or len(unknown) > 1):
        raise InputError(
            folder,
            "cannot tell the rank of " + ", ".join(t.path.name for t in unknown)
            + " (no distributedInfo and no rank number in the name); rename them rank<N>.json",
        )  # fmt: skip
    if unknown:  # a single trace without any rank: rank 0 of its own
        skipped.append(f"{unknown[0].path}: no distributedInfo and no rank in the name "
                       "(taken as rank 0)")  # fmt: skip
        unknown[0].rank = 0
        known = unknown
    if not known:
        why = f" ({errors[0]}" + (f"; and {len(errors) - 1} more)" if len(errors) > 1 else ")")
        raise InputError(folder, "no readable Kineto trace in the folder" + (why if errors else ""))
    known = shared_steps(folder, one_window(folder, known, skipped), skipped)
    if note := host_only_note(folder, known):
        skipped.append(note)
    return sorted(known, key=lambda t: int(t.rank or 0))


def host_only_note(folder: Path, traces: list[ParsedTrace]) -> str | None:
    """One line for the traces that call the device's runtime but hold no device event (a
    GPU job profiled without ProfilerActivity.CUDA, or its device activity lost): read as a
    CPU job's, their busy time would be the host's operators and their NCCL collectives
    nothing, so that is said, not assumed healthy; None where no trace is so."""
    host_only = [t for t in traces if t.launches_without_device]
    if not host_only:
        return None
    calls = sum(t.launches_without_device for t in host_only)
    ranks = ranks_phrase([int(t.rank or 0) for t in host_only])
    counted = sum(t.profiler_ranges for t in host_only)
    why = (f"hold the CUPTI range profiler's counters of {counted:,} kernels and no kernel's "
           "run (each kernel replayed alone to count its instructions: their times are no "
           "timeline)" if counted else "hold no device event (profiled without "
           "ProfilerActivity.CUDA, or the device's activity lost)")  # fmt: skip
    return (f"{folder}: the traces of {ranks} call the device's runtime ({calls:,} kernel "
            f"launches, copies) but {why}: the device's time is unknown, the steps and "
            "busy time here are the host's operators, and the NCCL collectives are not "
            "read")  # fmt: skip


def one_window(folder: Path, known: list[ParsedTrace], skipped: list[str]) -> list[ParsedTrace]:
    """One trace per rank. A profiler schedule that repeats (`schedule(..., repeat=2)`) writes
    a file per rank per profiled window; files of one rank whose steps do not overlap are
    those windows: the window most ranks have (the latest of equals) is analysed, and a note
    names the others. Files of one rank that overlap, or carry no steps, cannot be told apart:
    InputError naming them."""
    by_rank: dict[int, list[ParsedTrace]] = {}
    for trace in known:
        by_rank.setdefault(int(trace.rank or 0), []).append(trace)
    twice = {rank: traces for rank, traces in by_rank.items() if len(traces) > 1}
    if not twice:
        return known
    spans = {id(t): _step_span(t) for t in known}
    for rank, traces in sorted(twice.items()):
        ordered = sorted((spans[id(t)] or (0, -1)) for t in traces)
        apart = all(a[1] < b[0] for a, b in itertools.pairwise(ordered))
        if any(spans[id(t)] is None for t in traces) or not apart:
            listed = ", ".join(t.path.name for t in traces)
            raise InputError(folder, f"several trace files claim rank {rank} ({listed}) and "
                             "their profiled steps overlap or are absent")  # fmt: skip
    # a window is known by its first step; the one most ranks have, the latest of equals
    firsts = Counter(span[0] for t in known if (span := spans[id(t)]) is not None)
    chosen = max(firsts, key=lambda first: (firsts[first], first))
    kept = [t for t in known if (spans[id(t)] or (None,))[0] == chosen]
    others = sorted({span for t in known if (span := spans[id(t)]) and span[0] != chosen})
    shown = ", ".join(f"{a}-{b}" for a, b in others[:4]) + (" ..." if len(others) > 4 else "")
    last = max(span[1] for t in kept if (span := spans[id(t)]))
    skipped.append(
        f"{folder}: the traces hold {len(others) + 1} profiled windows (a repeating profiler "
        f"schedule); steps {chosen}-{last} are analysed ({len(kept)} ranks), not steps {shown}"
    )
    return kept


def shared_steps(folder: Path, known: list[ParsedTrace], skipped: list[str]) -> list[ParsedTrace]:
    """The traces whose ProfilerStep numbers meet most ranks'. A rank numbers its steps from
    when its profiler started: one whose numbers share none with the others' (not even through
    a chain of overlapping ranks) profiled other iterations, or counted from another start.
    Compared with the others' by number, its last step read as stopping steps early: a hang
    named where the traces show none. Such ranks are left out, with a note naming their steps;
    the largest set of ranks whose steps overlap is analysed (the latest of equals)."""
    # (a trace without ProfilerStep is step 0 by convention, no number to compare)
    spans = sorted(
        (span, int(t.rank or 0)) for t in known if t.numbered and (span := _step_span(t))
    )
    sets: list[tuple[int, int, list[int]]] = []  # (first, last, ranks) of overlapping spans
    for (first, last), rank in spans:
        if sets and first <= sets[-1][1]:
            sets[-1] = (sets[-1][0], max(sets[-1][1], last), [*sets[-1][2], rank])
        else:
            sets.append((first, last, [rank]))
    if len(sets) < 2:
        return known
    chosen = max(sets, key=lambda found: (len(found[2]), found[0]))
    apart = {rank: (first, last) for (first, last), rank in spans if rank not in chosen[2]}
    shown = ", ".join(f"rank {rank}: {a}-{b}" for rank, (a, b) in sorted(apart.items())[:6])
    more = f" and {len(apart) - 6} more" if len(apart) > 6 else ""
    skipped.append(
        f"{folder}: the ProfilerStep numbers of {ranks_phrase(sorted(apart))} ({shown}{more}) "
        f"share none with those of the other {len(chosen[2])} traced ranks (steps "
        f"{chosen[0]}-{chosen[1]}): their profilers counted from other iterations, or profiled "
        "other windows; compared by number, they would read as stopping early: left out"
    )
    return [t for t in known if int(t.rank or 0) not in apart]


def _step_span(trace: ParsedTrace) -> tuple[int, int] | None:
    """The first and last `ProfilerStep` number of a trace; None without steps."""
    steps = [s for row in trace.records.get("step", []) if isinstance(s := row.get("step"), int)]
    return (min(steps), max(steps)) if steps else None
