"""Ranks as text: `0-3,6`, `rank 1`, `ranks 0-3,6` (every stage that writes a sentence naming
ranks, the readers' notes and the reports, says them alike)."""

from __future__ import annotations

MAX_RANKS_SHOWN = 8
"""Runs of consecutive ranks a list shows before it counts the rest."""


def rank_list(ranks: list[int]) -> str:
    """`1`, `0-3,6`, or the first runs and a count when there are many: `0-3,6,9 (+12 more)`."""
    ordered = sorted({int(r) for r in ranks})
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(parts) > MAX_RANKS_SHOWN:
        shown = parts[:MAX_RANKS_SHOWN]
        rest = len(ordered) - sum(b - a + 1 for a, b in runs[:MAX_RANKS_SHOWN])
        return ",".join(shown) + f" (+{rest} more)"
    return ",".join(parts)


def ranks_phrase(ranks: list[int]) -> str:
    """`rank 1`, `ranks 0-3,6`: ranks as a sentence names them."""
    return f"{'rank' if len(set(ranks)) == 1 else 'ranks'} {rank_list(ranks)}"
