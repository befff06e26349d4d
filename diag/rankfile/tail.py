"""One growing rank file read a poll at a time (`diag.RunTail`: `diag watch`, `diag dashboard
--live`): each read returns the records appended since the last one, never one twice.

JSON lines (`.jsonl`): whole lines only; a line still being written waits for the next read. Arrow
(`.arrows`, diag/rankfile/arrow_format.py): whole IPC messages only (a collector appends one record
batch a flush, each one message): the framing of each message (continuation marker, metadata length,
the body length its metadata declares) says where it ends, and a message whose end is not in the
file yet waits for the next read. The complete messages are decoded by the full reader
(`arrow_format.records`, after the file's own schema message), so the checks are its checks: the
format's schema, no compressed or dictionary batches, every batch validated in full. A message that
is unreadable, or larger than one read, ends the reading of that file with a note (the full reader
stops there too).

Either way at most READ_MAX_BYTES are read from a file per poll (a long backlog is read over
several) and the records are returned unchecked: the caller checks each as the loader does.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.contract import schema
from diag.contract.files import NotReadable, open_regular
from diag.contract.limits import MAX_JSON_DEPTH, MAX_LINE_BYTES
from diag.rankfile import arrow_format
from diag.rankfile.arrow_messages import body_length
from diag.rankfile.record_checks import depth

READ_MAX_BYTES = 64 * 2**20
"""Bytes read from one rank file per poll at most."""
TAIL_MAX_FILE_BYTES = 2**62
"""A followed file is read READ_MAX_BYTES a poll, never whole: its size is not bounded (a long
run's file may pass MAX_RANK_FILE_BYTES, the bound on a file read whole); only what it is
(a regular file, not a FIFO or a device) is checked."""
_CONTINUATION = b"\xff\xff\xff\xff"
_PREFIX = 8  # the continuation marker and the metadata length (int32)


@dataclass
class FileTail:
    """A rank file read up to `offset`; `notes` gathers what was skipped and why."""

    path: Path
    offset: int = 0
    notes: list[str] = field(default_factory=list)

    def _read(self) -> bytes | None:
        try:
            with open_regular(self.path, TAIL_MAX_FILE_BYTES) as fh:
                fh.seek(self.offset)
                return fh.read(READ_MAX_BYTES)
        except NotReadable as err:  # a FIFO, a device, over its bound: noted once
            note = f"{self.path.name}: cannot read ({err.strerror}), not analysed"
            if note not in self.notes:
                self.notes.append(note)
            return None
        except OSError:
            return None  # not created yet, or being replaced: the next poll reads it

    def read_new(self) -> list[dict[str, Any]]:
        raise NotImplementedError


class JsonlTail(FileTail):
    """`rank-NNNNN.jsonl`: the JSON objects of the whole lines appended since the last read."""

    def read_new(self) -> list[dict[str, Any]]:
        data = self._read()
        if not data:
            return []
        name = self.path.name
        end = data.rfind(b"\n") + 1
        if end == 0:
            if len(data) > MAX_LINE_BYTES:  # a line that never ends: skip what was read
                self.offset += len(data)
                self.notes.append(f"{name}: a line longer than {MAX_LINE_BYTES} bytes, skipped")
            return []
        self.offset += end
        out = []
        for line in data[:end].split(b"\n"):
            if not line.strip():
                continue
            if len(line) > MAX_LINE_BYTES:
                self.notes.append(f"{name}: a line longer than {MAX_LINE_BYTES} bytes, skipped")
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                self.notes.append(f"{name}: a line that is not valid JSON, skipped")
                continue
            if depth(record) > MAX_JSON_DEPTH:
                self.notes.append(f"{name}: a record nested too deeply, skipped")
                continue
            out.append(record)
        return out


@dataclass
class ArrowTail(FileTail):
    """`rank-NNNNN.arrows`: the records of the whole record batches appended since the last
    read. `ended`: the end-of-stream marker was read, or the file was given up (a note says
    why); nothing more is read from it."""

    schema_message: bytes | None = None
    ended: bool = False

    def read_new(self) -> list[dict[str, Any]]:
        if self.ended:
            return []
        data = self._read()
        if not data:
            return []
        end, problem = self._complete(data)
        if self.schema_message is None and end > 0:
            self.schema_message = data[:end]  # the first read ends after the schema message
            self.offset += end
            data = data[end:]
            end, problem = self._complete(data)
        records: list[dict[str, Any]] = []
        if end and self.schema_message is not None:
            notes: list[str] = []
            stream = self.schema_message + data[:end]
            records = list(arrow_format.records(stream, self.path.name, notes))
            if notes:  # the full reader stopped before the end: the rest is not read either
                self.notes += notes
                self.ended = True
            self.offset += end
        if problem is not None:
            self.notes.append(f"{self.path.name}: {problem}; not read from there")
            self.ended = True
        return records

    def _complete(self, data: bytes) -> tuple[int, str | None]:
        """Where the whole messages at the start of `data` end (one only, the schema, while it
        has not been read), and why reading cannot go on past there (None: it can, later)."""
        at = 0
        while len(data) - at >= _PREFIX:
            if data[at : at + 4] != _CONTINUATION:
                return at, "not an Arrow IPC message (no continuation marker)"
            size = struct.unpack_from("<i", data, at + 4)[0]
            if size == 0:  # the end-of-stream marker: the writer closed the file
                self.ended = True
                return at, None
            if size < 0 or _PREFIX + size > READ_MAX_BYTES:
                return at, f"a message's metadata of {size} bytes is not readable"
            if at + _PREFIX + size > len(data):
                return at, None  # its metadata is still being written
            body = body_length(data[at + _PREFIX : at + _PREFIX + size])
            if body is None or _PREFIX + size + body > READ_MAX_BYTES:
                shown = "malformed" if body is None else f"{body} bytes"
                return at, f"a message whose body ({shown}) cannot be read"
            if at + _PREFIX + size + body > len(data):
                return at, None  # its body is still being written
            at += _PREFIX + size + body
            if self.schema_message is None:
                return at, None
        return at, None


def open_tail(folder: Path, rank: int) -> FileTail | None:
    """The tail of `rank`'s file in `folder`: its Arrow file when there is one (the loader's
    choice of two), else its JSON-lines file; None while neither exists."""
    arrows = folder / arrow_format.rank_file_name(rank)
    if arrows.is_file():
        return ArrowTail(arrows)
    jsonl = folder / schema.rank_file_name(rank)
    if jsonl.is_file():
        return JsonlTail(jsonl)
    return None
