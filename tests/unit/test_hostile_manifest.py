"""Hostile manifests: `manifest.json` truncated, garbage, empty, of the wrong types, with huge or
non-finite numbers, nested too deep, or declaring a world far larger than the rank files.

The cases and the contract: tests/unit/hostile_corpus.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.unit.hostile_corpus import (
    MANIFEST,
    Text,
    as_bytes,
    deep,
    family_tests,
    fatal,
    garbage,
    usable,
    valid_run,
)


def manifest_text(text: Text) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        run = valid_run(root)
        (run / "manifest.json").write_bytes(as_bytes(text))
        return run

    return build


def manifest_fields(**fields: Any) -> Callable[[Path], Path]:
    return lambda root: valid_run(root, **fields)


def world(world_size: int) -> Callable[[Path], Path]:
    return lambda root: valid_run(root, world_size=world_size, layout={"dp": world_size})


CASES = {
    # truncated
    "run.truncated/manifest": fatal(
        manifest_text('{"schema": "diag.run/1", "wor'), MANIFEST, "not valid JSON"
    ),
    # garbage
    "run.garbage/manifest": fatal(
        manifest_text(garbage(4096)), MANIFEST, "not valid JSON", cli=True
    ),
    "run.garbage/invalid-utf8-manifest": fatal(
        manifest_text(b'{"schema": "\xff"}'), MANIFEST, "not valid JSON"
    ),
    # empty
    "run.empty/manifest": fatal(manifest_text(""), MANIFEST, "not valid JSON"),
    # wrong types
    "run.types/manifest-world-string": fatal(
        manifest_fields(world_size="2"), MANIFEST, "world_size is '2'", cli=True
    ),
    "run.types/manifest-layout-list": fatal(
        manifest_fields(layout=[1]), MANIFEST, "not a JSON object"
    ),
    "run.types/manifest-is-list": fatal(manifest_text("[1, 2]"), MANIFEST, "not a JSON object"),
    "run.types/manifest-groups-string": fatal(
        manifest_fields(groups={"dp": "0,1"}), MANIFEST, "groups.dp"
    ),
    "run.types/manifest-rank-string": fatal(
        manifest_fields(ranks=[{"rank": "zero"}]), MANIFEST, "ranks"
    ),
    "run.types/manifest-command-list": fatal(
        manifest_fields(command=[[["x"]]]), MANIFEST, "command"
    ),
    # NaN and infinities
    "run.nan/manifest-bandwidth": usable(
        manifest_fields(hardware={"intra_node_GBps": float("nan")}), 2, None
    ),
    # huge integers
    "run.huge/world-10**12": fatal(world(10**12), MANIFEST, "world_size", cli=True),
    "run.huge/world-2**70": fatal(world(2**70), MANIFEST, "world_size"),
    "run.huge/layout-pp-10**30": fatal(
        manifest_fields(layout={"pp": 10**30}), MANIFEST, "layout.pp"
    ),
    "run.huge/manifest-rank-10**30": fatal(
        manifest_fields(ranks=[{"rank": 10**30}]), MANIFEST, "ranks"
    ),
    "run.huge/group-rank-10**12": fatal(
        manifest_fields(groups={"dp": [[0, 10**12]]}), MANIFEST, "groups.dp", cli=True
    ),
    "run.huge/group-rank-negative": fatal(
        manifest_fields(groups={"dp": [[0, -1]]}), MANIFEST, "groups.dp"
    ),
    "run.huge/manifest-5000-digits": fatal(
        manifest_text(f'{{"schema": "diag.run/1", "world_size": {"9" * 5000}}}'),
        MANIFEST,
        "not valid JSON",
    ),
    # deep nesting
    "run.deep/manifest": fatal(manifest_text("[" * 200_000), MANIFEST, "nested", cli=True),
    "run.deep/manifest-field": fatal(
        manifest_text(f'{{"schema": "diag.run/1", "world_size": 2, "model": {deep(200_000)}}}'),
        MANIFEST,
        "nested",
    ),
    # ranks
    "run.ranks/world-2000": usable(world(2000), 2, "1998 of 2000 ranks"),
}

test_hostile_input, test_hostile_input_through_the_command = family_tests(CASES)
