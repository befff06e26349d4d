"""The paths a user names with profiler traces: one rank's trace file on its own, and the parent
of several trace folders (a before/after pair), read from real traces when ../shared/real-traces
is present."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.cli.main import main

REAL_PAIR = Path(__file__).parents[3] / "shared" / "real-traces" / "hta-trace-diff"
pytestmark = pytest.mark.skipif(not REAL_PAIR.is_dir(), reason="../shared/real-traces is absent")


def cli(*args: str | Path):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the real before/after pair (control/, test/), so caches land in a temp dir."""
    return Path(shutil.copytree(REAL_PAIR, tmp_path_factory.mktemp("pair") / "pair"))


def test_one_trace_file_is_read_as_its_rank(pair: Path) -> None:
    file = pair / "test" / "test.json.gz"
    result = cli("analyze", file, "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    folder = json.loads(cli("analyze", pair / "test", "--format", "json").stdout)
    # the folder holds only this file: the same rank, steps and step time either way
    assert [r["rank"] for r in report["ranks"]] == [r["rank"] for r in folder["ranks"]]
    assert report["summary"]["step_time_s"] == folder["summary"]["step_time_s"]
    assert report["run"]["run_id"] == "test.json.gz"


def test_a_folder_of_trace_folders_names_them(pair: Path) -> None:
    result = cli("analyze", pair)
    assert result.exit_code == 2
    assert "2 below it (control/, test/)" in result.output
    assert "diag compare" in result.output


def test_compare_of_traces_without_tokens_does_not_claim_scaling(pair: Path) -> None:
    result = cli("compare", pair / "control", pair / "test", "--format", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert "grows" not in out["verdict"]
    assert "throughput unknown" in out["verdict"]
    assert "none names it" in out["verdict"]
