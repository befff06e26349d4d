"""A run directory's rank files rewritten in the other format (`diag convert`, `diag simulate
--format`), and one rank file read as plain records.

Each rank file is read on its own (the same bounded readers as `diag analyze`), written beside
it under a temporary name, renamed into place, and only then is the old file removed: a
conversion cut short leaves every rank readable. A JSONL file becomes one Arrow record batch a
step (records without a step, such as the meta line, go with the first); an Arrow file becomes
one JSON line a record. Lines or batches that cannot be read are skipped and counted.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diag.contract import schema
from diag.contract.files import open_regular, read_regular
from diag.contract.limits import MAX_JSON_DEPTH, MAX_MANIFEST_BYTES, MAX_RANK_FILE_BYTES
from diag.errors import InputError
from diag.rankfile import arrow_format
from diag.rankfile.rank_file import bounded_lines
from diag.rankfile.record_checks import depth

TARGETS = {"arrow": arrow_format.SUFFIX, "jsonl": ".jsonl"}


def convert_run(run_dir: Path, to: str) -> tuple[int, list[str]]:
    """Convert every rank file of `run_dir` not yet in format `to`; the number converted and
    notes on what was skipped. InputError when the folder is not a run directory."""
    manifest = run_dir / schema.MANIFEST_FILE
    if not manifest.exists():
        raise InputError(run_dir, "not a run directory (no manifest.json)")
    try:  # a FIFO, a device or a folder there is said as such
        open_regular(manifest, MAX_MANIFEST_BYTES).close()
    except OSError as err:
        raise InputError(manifest, f"cannot read ({err.strerror or err})") from None
    suffix = TARGETS[to]
    try:
        files = sorted(p for p in run_dir.iterdir() if schema.RANK_FILE_RE.match(p.name))
    except OSError as err:
        raise InputError(run_dir, f"cannot list the folder ({err.strerror or err})") from None
    notes: list[str] = []
    converted = 0
    for path in files:
        if path.suffix == suffix:
            continue
        target = path.with_suffix(suffix)
        try:
            data = read_regular(path, MAX_RANK_FILE_BYTES)
        except OSError as err:
            notes.append(f"{path.name}: cannot read ({err.strerror or err}), not converted")
            continue
        records = _arrow_records(data, path.name, notes) if path.suffix == arrow_format.SUFFIX \
            else _jsonl_records(data, path.name, notes)  # fmt: skip
        _write_new(target, records, to)
        path.unlink()
        converted += 1
    return converted, notes


def _write_new(target: Path, records: list[dict[str, Any]], to: str) -> None:
    """The records written in format `to` to a temporary file of a fresh name beside `target`
    (created exclusively: a link or a FIFO planted under any name is never opened), renamed
    onto `target` (a rename replaces a link there, never writes through it)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as stream:
            if to == "arrow":
                stream.write(arrow_format.stream_header())
                for batch in _by_step(records):
                    stream.write(arrow_format.encode_batch(batch))
                stream.write(arrow_format.END_OF_STREAM)
            else:
                for record in records:
                    stream.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def rank_file(run_dir: Path, rank: int) -> Path | None:
    """The rank's file in `run_dir` under the writer's name, Arrow first (the one the loader
    reads of two), or None."""
    for name in (arrow_format.rank_file_name(rank), schema.rank_file_name(rank)):
        if (run_dir / name).is_file():
            return run_dir / name
    return None


def rank_records(path: Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """Every readable record of one rank file, either format, as dicts (an Arrow file's typed
    fields all present, null where the record had none); what was skipped goes to `notes`."""
    data, found = read_regular(path, MAX_RANK_FILE_BYTES), [] if notes is None else notes
    if path.suffix == arrow_format.SUFFIX:
        return _arrow_records(data, path.name, found)
    return _jsonl_records(data, path.name, found)


def _jsonl_records(data: bytes, name: str, notes: list[str]) -> list[dict[str, Any]]:
    records, bad = [], 0
    for _, line in bounded_lines(data):
        if line is not None and not line.strip():
            continue
        try:
            record = None if line is None else json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict) or depth(record) > MAX_JSON_DEPTH:
            bad += 1
            continue
        records.append(record)
    if bad:
        notes.append(f"{name}: {bad} unreadable lines skipped")
    return records


def _arrow_records(data: bytes, name: str, notes: list[str]) -> list[dict[str, Any]]:
    records = list(arrow_format.records(data, name, notes))
    return records


def _by_step(records: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Consecutive records grouped into one batch a step, as a collector flushes them."""
    batch: list[dict[str, Any]] = []
    current: Any = None
    for record in records:
        step = record.get("step")
        if batch and step is not None and current is not None and step != current:
            yield batch
            batch = []
        if step is not None:
            current = step
        batch.append(record)
    if batch:
        yield batch
