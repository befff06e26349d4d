"""Numbers as a person reads them: shared by the text, Markdown and HTML reports, `check`,
`compare` and the dashboard. Every function maps None to "n/a"."""

from __future__ import annotations

from typing import Any

MIB = 1024**2


def num(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.3g}"


def pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def pct_range(low: float, high: float) -> str:
    """`3-59%`: two shares as one range."""
    return f"{100 * low:.0f}-{100 * high:.0f}%"


def si(value: Any) -> str:
    if value is None:
        return "n/a"
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def size(value: Any) -> str:
    if value is None:
        return "n/a"
    for factor, unit in ((1024**3, "GiB"), (MIB, "MiB"), (1024, "KiB")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {unit}"
    return f"{value:.0f} B"


def mib(value: Any) -> str:
    return "n/a" if value is None else f"{value / MIB:.1f}"


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells as left-aligned text columns; a shorter row is a note spanning the table."""
    columns = max(len(r) for r in rows)
    sizes = [max(len(r[i]) for r in rows if len(r) == columns) for i in range(columns)]
    out = []
    for row in rows:
        if len(row) < columns:
            out.append("  " + " ".join(row))
            continue
        out.append(
            "  "
            + "  ".join(cell.ljust(width) for cell, width in zip(row, sizes, strict=True)).rstrip()
        )
    return out


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


def format_metric(name: str, value: float | None) -> str:
    """A metric as a person reads it: shares in %, bytes in KiB/MiB/GiB, throughput as 1.4k."""
    if name.endswith("_share") or name.endswith("_fraction"):
        return pct(value)
    if name.endswith("_bytes"):
        return size(value)
    if name.endswith("_per_s"):
        return si(value)
    return num(value)
