"""Processes as Linux's /proc lists them. Its one job: which processes a process started (an
analysis killed by a benchmark or a test, and the workers it may leave behind)."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (/proc/PID/stat's parent field, after the
    command's name, which is in parentheses and may hold spaces and parentheses itself)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            out.append(int(entry.name))
    return out
