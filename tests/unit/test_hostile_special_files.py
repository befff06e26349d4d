"""Hostile special files in a run directory or a trace folder: a FIFO, a device (`/dev/zero`,
`/dev/urandom`), a `/proc` file that says 0 bytes and goes on, a sparse file far over its bound,
named as a rank file, the manifest or a trace. Each is refused before it is read
(diag/contract/files.py) rather than hanging the reader or taking the machine's memory.

The cases and the contract: tests/unit/hostile_corpus.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tests.unit.hostile_corpus import MANIFEST, family_tests, fatal, usable, valid_run
from tests.unit.test_kineto import _step_events, _trace

RANK1 = "rank-00001.jsonl"
PROC_ENDLESS = "/proc/self/pagemap"
"""Regular by its mode, 0 bytes by its size, and 8 bytes per page of the reader's address space
(terabytes) when read."""


def replaced(name: str, make: Callable[[Path], None]) -> Callable[[Path], Path]:
    """A valid run with `name` replaced by what `make` puts at its path."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / name).unlink()
        make(run / name)
        return run

    return build


def fifo(path: Path) -> None:
    os.mkfifo(path)


def link_to(target: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.symlink_to(target)

    return make


def sparse(size_bytes: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with open(path, "wb") as fh:
            fh.truncate(size_bytes)

    return make


def trace_beside(make: Callable[[Path], None]) -> Callable[[Path], Path]:
    """A trace folder of rank 0's valid trace and rank 1's trace file made by `make`."""

    def build(root: Path) -> Path:
        folder = root / "traces"
        folder.mkdir()
        (folder / "rank0.pt.trace.json").write_text(json.dumps(_trace(0, events=_step_events())))
        make(folder / "rank1.pt.trace.json")
        return folder

    return build


CASES = {
    # FIFOs: opening one for reading waits for a writer that never comes
    "special.fifo/rank-file": usable(replaced(RANK1, fifo), 1, "a FIFO", cli=True),
    "special.fifo/manifest": fatal(replaced("manifest.json", fifo), MANIFEST, "a FIFO", cli=True),
    "special.fifo/trace": usable(trace_beside(fifo), 1, None),
    # devices: endless bytes
    "special.dev/rank-file-zero": usable(
        replaced(RANK1, link_to("/dev/zero")), 1, "a character device", cli=True
    ),
    "special.dev/rank-file-urandom": usable(
        replaced(RANK1, link_to("/dev/urandom")), 1, "a character device"
    ),
    "special.dev/manifest-zero": fatal(
        replaced("manifest.json", link_to("/dev/zero")), MANIFEST, "a character device"
    ),
    "special.dev/trace-zero": usable(trace_beside(link_to("/dev/zero")), 1, None),
    # a regular file whose size says 0 and whose reading goes on
    "special.proc/rank-file": usable(replaced(RANK1, link_to(PROC_ENDLESS)), 1, "a /proc file"),
    "special.proc/manifest": fatal(
        replaced("manifest.json", link_to(PROC_ENDLESS)), MANIFEST, "a /proc file"
    ),
    # sparse files far over their bound (diag/contract/limits.py): refused by their size
    "special.sparse/rank-file-64GiB": usable(
        replaced(RANK1, sparse(64 * 2**30)), 1, "64.0 GiB, over the 2.0 GiB", cli=True
    ),
    "special.sparse/manifest-4GiB": fatal(
        replaced("manifest.json", sparse(4 * 2**30)), MANIFEST, "4.0 GiB, over the 64.0 MiB"
    ),
    "special.sparse/trace-64GiB": usable(trace_beside(sparse(64 * 2**30)), 1, None),
}

test_hostile_input, test_hostile_input_through_the_command = family_tests(CASES)
