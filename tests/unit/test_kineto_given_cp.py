"""`--layout ...,cp=N` on a trace folder: context parallelism given by hand lays its groups
next to tensor parallelism (diag.contract.names.grid_groups), as the traces' own rings say,
and the pipeline's micro-batches are still read from the traces (diag/read/kineto/schedule.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.api import load_any
from diag.cli.main import main
from diag.cli.options import parse_layout


@pytest.fixture(scope="module")
def rings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dp2 x cp2 x pp2: the simulated tensor-parallel groups pass keys and values round a
    ring (`--trace-shape ring-cp`), 4 micro-batches a step."""
    out = tmp_path_factory.mktemp("cp") / "traces"
    args = ["--ranks", "8", "--layout", "dp=2,tp=2,pp=2", "--microbatches", "4", "--steps", "3",
            "--format", "kineto", "--trace-shape", "ring-cp"]  # fmt: skip
    subprocess.run([sys.executable, "-m", "diag", "simulate", "--out", str(out), *args],
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    return out


def test_a_given_cp_axis_lays_its_groups_as_the_traces_rings_do(rings: Path) -> None:
    """(Read from the traces alone, a ring of two reads as a two-stage pipeline: the layout's
    known limit, which `--layout cp=2` lifts.)"""
    given = load_any(rings, layout=parse_layout("dp=2,pp=2,cp=2"))
    manifest = given.manifest
    assert (manifest.layout.dp, manifest.layout.pp, manifest.layout.cp) == (2, 2, 2)
    assert manifest.groups["cp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # the rings' members
    assert manifest.groups["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert manifest.groups["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    ring = given.comms[given.comms["group"] == "cp"]
    assert not ring.empty and set((ring["peer"] - ring["rank"]).abs()) == {1}
    # the pipeline's 4 micro-batches from its own sends, not the rings'
    assert (manifest.layout.microbatches, manifest.layout.virtual_stages) == (4, 1)
    assert manifest.schedule_known


def test_a_ring_of_two_read_as_a_pipeline_leaves_m_unknown(rings: Path) -> None:
    """From the traces alone the rings of two read as the pipeline (the layout's limit): the
    messages of the real pipeline's groups, which the layout placed nowhere, say that which
    messages are the pipeline's is not known (m read from the rings' would be 64)."""
    manifest = load_any(rings).manifest
    assert not manifest.schedule_known
    assert "schedule unknown: sends and receives in a group of ranks" in str(manifest.layout_source)


def test_the_cli_takes_cp_in_the_layout(rings: Path) -> None:
    result = CliRunner().invoke(main, ["analyze", str(rings), "--layout", "dp=2,pp=2,cp=2"])
    assert result.exit_code == 0, result.output
    assert "cp=2" in result.output.splitlines()[0]
    wrong = CliRunner().invoke(main, ["analyze", str(rings), "--layout", "dp=2,pp=2"])
    assert wrong.exit_code == 2 and "dp x tp x pp x ep x cp = 4" in wrong.output
