"""One line of progress on stderr while a long read runs: files and bytes done, the rate, the
time left.

Only on a terminal (a pipe, a log file or a JSON consumer never sees it) and only once the
read has run `AFTER_S`: a small run reads in silence. The line is rewritten in place (`\\r`)
at most every `EVERY_S` and ended with a newline when the read ends, so what the analysis
prints next starts on a line of its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

AFTER_S = 2.0
"""A read still running after this long shows its progress."""
EVERY_S = 0.25
"""The line is rewritten at most this often (a terminal is slow to scroll, a person to read)."""
MIB = 2**20


class Progress:
    """What a read has done of `total_files` files of `total_bytes`; `advance` as pieces end.

    `enabled`: None decides by the stream (a terminal only); True or False forces it (tests,
    a caller that knows better); `after_s`: AFTER_S unless given; `clock`: the monotonic
    clock in seconds."""

    def __init__(
        self,
        label: str,
        total_files: int,
        total_bytes: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total_files = total_files
        self.total_bytes = total_bytes
        self.files = 0
        self.bytes = 0
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = _is_terminal(self._stream) if enabled is None else enabled
        self._after_s = AFTER_S if after_s is None else after_s
        self._clock = clock
        self._started = clock()
        self._shown_at: float | None = None  # when the line was last written; None: never

    def advance(self, files: int, size_bytes: int) -> None:
        """`files` more files, `size_bytes` more bytes done; the line rewritten if it is due,
        ended when everything is done."""
        self.files += files
        self.bytes += size_bytes
        if not self._enabled:
            return
        now = self._clock()
        finished = self.files >= self.total_files
        if now - self._started < self._after_s:
            return  # short reads stay silent, their last piece included
        if not finished and self._shown_at is not None and now - self._shown_at < EVERY_S:
            return
        self._shown_at = now
        end = "\n" if finished else ""
        self._stream.write(f"\r{self.line(now)}{end}")
        self._stream.flush()

    def line(self, now: float | None = None) -> str:
        """`diag: read 12/64 trace files, 310/1,100 MiB, 45.0 MiB/s, 18 s left`."""
        elapsed_s = max((self._clock() if now is None else now) - self._started, 1e-9)
        rate = self.bytes / elapsed_s
        text = (
            f"diag: read {self.files}/{self.total_files} {self.label}, "
            f"{self.bytes / MIB:,.0f}/{self.total_bytes / MIB:,.0f} MiB, {rate / MIB:.1f} MiB/s"
        )
        if self.files >= self.total_files:
            return f"{text}, {elapsed_s:.0f} s"
        if rate <= 0:
            return f"{text}, time left unknown"
        left_s = max(self.total_bytes - self.bytes, 0) / rate
        return f"{text}, {left_s:.0f} s left  "  # spaces: erase a longer line's tail


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
