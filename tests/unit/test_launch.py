"""`diag run` argument handling and the torchrun command it builds (no processes spawned)."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from diag.cli.launch import torchrun_command
from diag.cli.main import main


def test_single_node_uses_standalone_rendezvous() -> None:
    cmd = torchrun_command("reference_runs.dp", ["--steps", "2"], nproc=4)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in cmd and "--standalone" in cmd
    assert cmd[-4:] == ["-m", "reference_runs.dp", "--steps", "2"]


def test_multi_node_options_pass_through_to_torchrun() -> None:
    cmd = torchrun_command(
        "reference_runs.dp", [], 8, nnodes=2, node_rank=1, rdzv_endpoint="head:29500"
    )
    assert "--standalone" not in cmd
    for option in (
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-endpoint=head:29500",
        "--rdzv-backend=c10d",
    ):
        assert option in cmd


def test_bad_injection_is_a_usage_error_before_anything_starts(tmp_path) -> None:
    result = CliRunner().invoke(
        main, ["run", "dp", "--nproc", "2", "--out", str(tmp_path), "--inject", "straggler:ms=x"]
    )
    assert result.exit_code == 2
    assert "straggler:ms=x" in result.output
    assert not any(tmp_path.iterdir())


def test_unknown_trainer_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["run", "cp", "--nproc", "2"])
    assert result.exit_code == 2
    assert "'cp' is not one of" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["pp", "--nproc", "4", "--layers", "3"], "--layers (3) must be divisible"),
        (["ep", "--nproc", "2", "--experts", "3"], "--experts (3) must be divisible by ep (2)"),
        (["dp", "--nproc", "4", "--dp", "2"], "!= world_size(4)"),
        (
            ["tp", "--nproc", "2", "--tp", "2", "--pp", "1", "--heads", "3", "--hidden", "96"],
            "--heads (3)",
        ),
    ],
)
def test_impossible_layout_is_a_one_line_error_before_launch(tmp_path, args, says) -> None:
    result = CliRunner().invoke(main, ["run", *args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert says in result.output and result.output.count("\n") == 1
    assert not (tmp_path / "run").exists()
