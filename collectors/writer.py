"""Append-only writers of one rank's records, safe to call from communication threads: JSON lines
(`rank-NNNNN.jsonl`) or an Arrow IPC stream (`rank-NNNNN.arrows`, diag/rankfile/arrow_format.py)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Literal

from collectors.safety import report_once
from diag.contract.schema import rank_file_name

RankFormat = Literal["arrow", "jsonl"]
FORMATS: tuple[RankFormat, ...] = ("arrow", "jsonl")


class RankWriter:
    """Buffers records in memory and writes them out on `flush()` (at least once per step).

    Each flush ends with a `write()` to the OS, so the lines of every flushed step survive a
    SIGKILL of the process (they sit in the kernel's page cache, not in Python's buffer).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # held only to append or swap the pending list
        # Held while a flush writes: the watchdog thread flushes too (collectors/watchdog.py),
        # and two flushes must reach the file whole and in order. The watchdog only tries it
        # for a moment (`flush(timeout_s=...)`), so the training thread never waits on a
        # watchdog stuck in a write for longer than that write.
        self._io_lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        # A new run replaces an older rank file of the same name (never mixes two runs).
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._file.write(self._header())
        self._file.flush()

    def _header(self) -> bytes:
        return b""

    def _encode(self, records: list[dict[str, Any]]) -> bytes:
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        return text.encode("utf-8")

    def _trailer(self) -> bytes:
        return b""

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(record)

    def flush(self, timeout_s: float = -1) -> bool:
        """Write the pending records out; False (nothing written) when another flush held the
        file for more than `timeout_s` (-1: wait as long as it takes)."""
        if not self._io_lock.acquire(timeout=timeout_s):
            return False
        try:
            with self._lock:
                records, self._pending = self._pending, []
            if not records or self._file.closed:
                return True
            # one write() per flush: a kill leaves whole flushes (an Arrow batch is one message)
            self._file.write(self._encode(records))
            self._file.flush()
            return True
        finally:
            self._io_lock.release()

    def close(self) -> None:
        if self._file.closed:
            return
        self.flush()
        with self._io_lock:
            if not self._file.closed:
                self._file.write(self._trailer())
                self._file.close()


class ArrowRankWriter(RankWriter):
    """The same, as an Arrow IPC stream: the schema when created, one record batch (one IPC
    message, one `write()`) per flush, the end-of-stream marker on close."""

    def _header(self) -> bytes:
        # pyarrow is imported only by ranks that write Arrow
        from diag.rankfile import arrow_encode, arrow_format

        self._format, self._encode_flush = arrow_format, arrow_encode.encode_flush
        return arrow_format.stream_header()

    def _encode(self, records: list[dict[str, Any]]) -> bytes:
        # the batch assembled from its buffers: arrow_format.encode_batch's bytes, ~3x cheaper
        return self._encode_flush(records)

    def _trailer(self) -> bytes:
        return self._format.END_OF_STREAM


FORMAT_ENV = "DIAG_RANK_FORMAT"
"""Chooses the format of recorders that are not given one (e.g. `DIAG_RANK_FORMAT=jsonl
diag run dp ...`: the reference trainers do not pass one). Unset or empty: Arrow."""
DEFAULT_FORMAT: RankFormat = "arrow"


def open_rank_writer(run_dir: Path, rank: int, format: RankFormat | None = None) -> RankWriter:
    """The writer of `rank`'s file in `run_dir`, in `format` ("arrow" or "jsonl"; None: the
    environment's DIAG_RANK_FORMAT, else "arrow"). ValueError for any other `format`; another
    DIAG_RANK_FORMAT is logged once and the default written (a typo in the job's environment
    must not stop its training)."""
    if format is None:
        chosen = os.environ.get(FORMAT_ENV, "").strip().lower() or DEFAULT_FORMAT
        if chosen not in FORMATS:
            error = ValueError(f"{FORMAT_ENV}={chosen!r}, expected one of {', '.join(FORMATS)}; "
                               f"writing {DEFAULT_FORMAT}")  # fmt: skip
            report_once(FORMAT_ENV, error)
            chosen = DEFAULT_FORMAT
        format = chosen
    if format == "arrow":
        from diag.rankfile.arrow_format import rank_file_name as arrow_name

        return ArrowRankWriter(run_dir / arrow_name(rank))
    if format == "jsonl":
        return RankWriter(run_dir / rank_file_name(rank))
    raise ValueError(f"rank file format {format!r}, expected one of {', '.join(FORMATS)}")
