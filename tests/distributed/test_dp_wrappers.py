"""Data-parallel wrappers recorded with no layout given, on 2 gloo ranks
(tests/distributed/dp_wrappers_job.py): a user's DDP communication hook (bf16 compression,
PowerSGD) under the recording hook still synchronises, and its real payload is recorded against
the uncompressed gradients, so the report's ratio is the compression; FSDP2's sharding group is
the `dp` group and the layout is inferred."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import diag
from tests.conftest import raw_records
from tests.distributed.conftest import FORKRUN

pytestmark = pytest.mark.dist

PARAM_BYTES = (64 * 128 + 128 + 128 * 64 + 64) * 4
# PowerSGD at rank 1: P (n x 1) and Q (m x 1) per weight matrix; biases go uncompressed
POWERSGD_BYTES = 2 * (128 + 64) * 4 + (128 + 64) * 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hooks")
    # its 2 ranks forked from a launcher that imported torch (forkrun.py: torchrun's environment)
    launch = [sys.executable, str(FORKRUN), "2", "tests.distributed.dp_wrappers_job", str(out)]
    result = subprocess.run(launch, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return out


def grad_records(run: Path, rank: int = 0) -> list[dict[str, Any]]:
    return [r for r in raw_records(run, rank) if r["kind"] == "comm" and r["tag"] == "grad"]


def grad_row(run: Path) -> dict[str, Any]:
    (row,) = [c for c in diag.analyze_path(run)["collectives"] if c["tag"] == "grad"]
    return row


@pytest.mark.parametrize("name", ["bf16", "powersgd"])
def test_the_users_hook_still_synchronises_the_ranks(runs: Path, name: str) -> None:
    assert json.loads((runs / name / "weights.json").read_text())["max_rank_difference"] == 0.0
    events = raw_records(runs / name, 1)
    (sync,) = [e for e in events if e.get("name") == "grad_sync"]
    assert sync["hook"] in {"bf16_compress_hook", "powerSGD_hook"} and sync["group_size"] == 2


def test_bf16_compression_sends_half_the_gradient_bytes(runs: Path) -> None:
    for rank in (0, 1):
        records = grad_records(runs / "bf16", rank)
        assert len(records) == 5  # one bucket a step
        for r in records:
            assert r["bytes"] * 2 == r["expected_bytes"] == PARAM_BYTES
            assert r["dtype"] == "bfloat16" and r["group"] == "dp" and r["t0"] <= r["t1"]
    assert grad_row(runs / "bf16")["ratio"] == pytest.approx(0.5)


def test_powersgd_payload_is_its_low_rank_factors(runs: Path) -> None:
    by_step = {r["step"]: r for r in grad_records(runs / "powersgd")}
    assert [by_step[s]["bytes"] for s in (0, 1)] == [PARAM_BYTES] * 2  # before start_powerSGD_iter
    assert [by_step[s]["bytes"] for s in (2, 3, 4)] == [POWERSGD_BYTES] * 3
    assert all(r["expected_bytes"] == PARAM_BYTES for r in by_step.values())
    ratio = grad_row(runs / "powersgd")["ratio"]
    assert ratio < 0.75  # the analysed steps (warm-up excluded) are mostly compressed


@pytest.mark.parametrize("name", ["bf16", "fsdp"])
def test_the_layout_is_inferred_from_the_wrapper(runs: Path, name: str) -> None:
    manifest = json.loads((runs / name / "manifest.json").read_text())
    assert manifest["layout"]["dp"] == 2 and manifest["groups"]["dp"] == [[0, 1]]
    assert manifest["layout"]["zero_stage"] == (3 if name == "fsdp" else 0)
    groups = {r["group"] for r in grad_records(runs / name)}
    assert groups == ({"dp"} if name == "bf16" else set())


def test_fsdp_reduce_scatters_are_in_the_dp_group(runs: Path) -> None:
    report = diag.analyze_path(runs / "fsdp")
    (rs,) = [c for c in report["collectives"] if c["tag"] == "fsdp.rs"]
    assert rs["group"] == "dp" and rs["op"] == "reduce_scatter"
    assert not [f for f in report["findings"] if f["rule"] == "PIT004"]


def test_with_collectors_off_the_users_hook_still_runs(runs: Path) -> None:
    for rank in (0, 1):
        hooks = json.loads((runs / f"off-hooks-{rank}.json").read_text())
        assert hooks == ["fp16_compress_hook"]


def test_a_hook_registered_before_is_kept_and_said_unrecorded(runs: Path) -> None:
    events = raw_records(runs / "hooked", 0)
    names = {e.get("name"): e for e in events if e["kind"] == "event"}
    assert names["grad_sync"]["tag"] is None  # no tag: the no-sync rule does not judge it
    assert "already has a comm hook" in names["grad_sync_unrecorded"]["reason"]
    report = diag.analyze_path(runs / "hooked")  # and the report says what it lacks
    assert any(
        "gradient synchronisation was not recorded (the model already has a comm hook)" in note
        for note in report["skipped"]
    ), report["skipped"]
