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
