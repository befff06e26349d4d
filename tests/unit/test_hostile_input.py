"""Hostile input: broken run directories and trace folders never crash `diag analyze`.

The corpus is split by input family, one module each, over the shared case type and contract of
tests/unit/hostile_corpus.py: test_hostile_manifest.py, test_hostile_rank_files.py (JSONL
records), test_hostile_run_layout.py (links, folders, rank file names) and
test_hostile_traces.py (Kineto trace folders); Arrow rank files in test_hostile_arrow.py. Here:
every family (the part of a case's name before `/`) has a case that also runs `diag analyze`
as a process.
"""

from __future__ import annotations

from tests.unit.test_hostile_manifest import CASES as MANIFEST_CASES
from tests.unit.test_hostile_rank_files import CASES as RANK_FILE_CASES
from tests.unit.test_hostile_run_layout import CASES as LAYOUT_CASES
from tests.unit.test_hostile_traces import CASES as TRACE_CASES

CASES = {**MANIFEST_CASES, **RANK_FILE_CASES, **LAYOUT_CASES, **TRACE_CASES}
CLI_CASES = {name: case for name, case in CASES.items() if case.cli}


def test_every_family_runs_through_the_command() -> None:
    families = {name.split("/")[0] for name in CASES}
    assert families == {name.split("/")[0] for name in CLI_CASES}
