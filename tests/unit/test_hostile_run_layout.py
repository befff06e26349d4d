"""Hostile run layouts: symbolic links to themselves or looping, a folder where a file belongs,
rank files under other names (a second file of one rank, a rank outside the world).

The cases and the contract: tests/unit/hostile_corpus.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.unit.hostile_corpus import (
    MANIFEST,
    family_tests,
    fatal,
    usable,
    valid_run,
)


def self_link(name: str) -> Callable[[Path], Path]:
    """`name` in the run (a rank file, traces/) is a symbolic link to itself."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / name).unlink(missing_ok=True)
        (run / name).symlink_to(name)
        return run

    return build


def traces_loop(root: Path) -> Path:
    """RUN/traces -> RUN: a folder that contains itself."""
    run = valid_run(root)
    (run / "traces").symlink_to("..")
    return run


def a_folder(name: str) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / name).unlink()
        (run / name / "x").mkdir(parents=True)
        return run

    return build


def extra_rank_file(name: str) -> Callable[[Path], Path]:
    """A copy of rank 1's file under another name (a second file of rank 1, or a rank outside
    the world)."""

    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / name).write_bytes((run / "rank-00001.jsonl").read_bytes())
        return run

    return build


def input_loop(root: Path) -> Path:
    (root / "loop").symlink_to("loop")
    return root / "loop"


CASES = {
    # huge integers
    "run.huge/rank-file-10**20": usable(
        extra_rank_file(f"rank-{10**20}.jsonl"), 2, "outside the world"
    ),
    # symbolic links
    "run.link/rank-file-to-itself": usable(
        self_link("rank-00001.jsonl"), 1, "cannot read", cli=True
    ),
    "run.link/traces-to-itself": usable(self_link("traces"), 2, None),
    "run.link/traces-loop": usable(traces_loop, 2, None),
    "run.link/input-to-itself": fatal(input_loop, "loop", "no such file"),
    # a folder where a file belongs
    "run.folder/rank-file": usable(a_folder("rank-00001.jsonl"), 1, "cannot read", cli=True),
    "run.folder/manifest": fatal(a_folder("manifest.json"), MANIFEST, "cannot read", cli=True),
    # ranks
    "run.ranks/duplicate": usable(extra_rank_file("rank-000001.jsonl"), 2, "rank 1", cli=True),
    "run.ranks/outside-world": usable(extra_rank_file("rank-00005.jsonl"), 2, "outside the world"),
}

test_hostile_input, test_hostile_input_through_the_command = family_tests(CASES)
