"""Append-only JSONL writer for one rank, safe to call from communication threads."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


class RankWriter:
    """Buffers records in memory and writes them out on `flush()` (at least once per step).

    Each flush ends with a `write()` to the OS, so the lines of every flushed step survive a
    SIGKILL of the process (they sit in the kernel's page cache, not in Python's buffer).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        # A new run replaces an older rank file of the same name (never mixes two runs).
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(record)

    def flush(self) -> None:
        with self._lock:
            records, self._pending = self._pending, []
        if not records or self._file.closed:
            return
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        self._file.write(text)
        self._file.flush()

    def close(self) -> None:
        self.flush()
        self._file.close()
