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
    """Given, the axis lays its groups as the traces' rings do."""
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


def test_rings_of_two_are_told_from_a_two_stage_pipeline_by_the_traces_alone(
    rings: Path,
) -> None:
    """Groups of two that only swap messages (every send with a receive: ring attention's
    rounds) are context parallel; the groups of two whose first stage sends alone (a
    pipeline's warm-up) are the pipeline, whose 4 micro-batches are read from its own sends
    (m read from the rings' would be 64). Before, the rings read as the pipeline and m as
    unknown."""
    manifest = load_any(rings).manifest
    assert (manifest.layout.dp, manifest.layout.pp, manifest.layout.cp) == (2, 2, 2)
    assert manifest.groups["cp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert manifest.groups["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert "only swapping messages" in str(manifest.layout_source)
    assert manifest.schedule_known and manifest.layout.microbatches == 4


def test_the_cli_takes_cp_in_the_layout(rings: Path) -> None:
    result = CliRunner().invoke(main, ["analyze", str(rings), "--layout", "dp=2,pp=2,cp=2"])
    assert result.exit_code == 0, result.output
    assert "cp=2" in result.output.splitlines()[0]
    wrong = CliRunner().invoke(main, ["analyze", str(rings), "--layout", "dp=2,pp=2"])
    assert wrong.exit_code == 2 and "dp x tp x pp x ep x cp = 4" in wrong.output


def test_a_message_is_alone_without_one_of_the_other_kind_beside_it() -> None:
    from diag.read.kineto.packed_comms import EXCHANGE_NS, lone_messages

    def msg(op: str, t0: int, members: tuple[int, ...] = (0, 1)) -> dict:
        return {"op": op, "t0": t0, "rank": 0, "step": 3, "group_ranks": members}

    comms = [
        msg("send", 0), msg("recv", 10),  # swapped
        msg("send", 10_000_000),  # a pipeline's warm-up send: alone
        msg("recv", 20_000_000), msg("send", 20_000_000 + EXCHANGE_NS + 1),  # too far apart
        msg("send", 0, (0, 1, 2)),  # a larger group's: not read here
        {**msg("all_reduce", 0)},
    ]  # fmt: skip
    assert lone_messages(comms) == {0: False, 1: False, 2: True, 3: True, 4: True}
