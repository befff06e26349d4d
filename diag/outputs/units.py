"""Numbers as a person reads them: shared by the text, Markdown and HTML reports, `check`,
`compare` and the dashboard. Every function maps None to "n/a"."""

from __future__ import annotations

from typing import Any

# ranks as text live with the contract (the readers' notes say them too); named here as well
from diag.contract.rank_text import MAX_RANKS_SHOWN as MAX_RANKS_SHOWN
from diag.contract.rank_text import rank_list as rank_list
from diag.contract.rank_text import ranks_phrase as ranks_phrase

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


def format_metric(name: str, value: float | None) -> str:
    """A metric as a person reads it: shares in %, bytes in KiB/MiB/GiB, throughput as 1.4k."""
    if name.endswith("_share") or name.endswith("_fraction"):
        return pct(value)
    if name.endswith("_bytes"):
        return size(value)
    if name.endswith("_per_s"):
        return si(value)
    return num(value)
