"""The grid of an older trace folder (no process groups) from the order and timing of its ops
(diag/read/kineto/grid_placement.py): the pipeline's first stage opens each step by sending,
tensor-parallel partners end every collective together, replicas drift apart."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.kineto_equivalence import simulate
from diag.api import load_any
from diag.contract.names import DP, PP, TP, grid_groups
from diag.read.kineto.grid_placement import PlacementMarks, inferred, marks

SHOWN_3D = frozenset({DP, TP, PP})


def _marks(
    sizes: dict[str, int],
    order: tuple[str, ...],
    drift_ns: float,
    offset_ns: int = 0,
    seed: int = 0,
) -> dict[int, PlacementMarks]:
    """Every rank's marks in a job laid out in `order`: the first stage's steps open with a
    send, the others' with a receive; a TP group's members end each of 32 collectives at one
    moment (plus `offset_ns` on odd ranks: their host's or device's clock), each group on its
    own walk of `drift_ns` a collective."""
    groups = grid_groups(sizes, order)
    world = sizes[DP] * sizes[TP] * sizes[PP]
    firsts = {g[0] for g in groups.get(PP, [list(range(world))])}
    rng = np.random.default_rng(seed)
    out: dict[int, PlacementMarks] = {}
    tp_groups = groups.get(TP, [[r] for r in range(world)])
    for group in tp_groups:
        walk = np.cumsum(1_000_000 + rng.normal(0, drift_ns, size=32)).astype(np.int64)
        for r in group:
            opened = "send" if r in firsts or PP not in groups else "recv"
            out[r] = PlacementMarks(
                {opened: 3}, {s: [int(t) + offset_ns * (r % 2) for t in walk] for s in (1, 2)}
            )
    return out


@pytest.mark.parametrize("order", [(DP, PP, TP), (PP, DP, TP)], ids=["devicemesh", "megatron"])
@pytest.mark.parametrize("dp_tp_pp", [(2, 2, 4), (4, 2, 2), (2, 4, 2)])
def test_the_grid_and_its_order_are_read_from_the_first_stage_and_lockstep(
    order: tuple[str, ...], dp_tp_pp: tuple[int, int, int]
) -> None:
    sizes = dict(zip((DP, TP, PP), dp_tp_pp, strict=True))
    world = dp_tp_pp[0] * dp_tp_pp[1] * dp_tp_pp[2]
    grid = inferred(world, SHOWN_3D, _marks(sizes, order, drift_ns=20_000, offset_ns=3_000))
    assert not isinstance(grid, str), grid
    assert grid.sizes == sizes
    assert grid.groups == grid_groups(sizes, order)
    assert f"pp={sizes[PP]}: {world // sizes[PP]} of {world} ranks open" in grid.how
    assert ("Megatron" in grid.how) == (order == (PP, DP, TP))


def test_tensor_and_data_parallel_without_a_pipeline() -> None:
    sizes = {DP: 4, TP: 4, PP: 1}
    grid = inferred(16, frozenset({DP, TP}), _marks(sizes, (DP, PP, TP), drift_ns=20_000))
    assert not isinstance(grid, str), grid
    assert (grid.sizes, grid.groups) == (sizes, grid_groups(sizes))


def test_replicas_drifting_by_microseconds_leave_the_split_unknown() -> None:
    """A small model's replicas drift apart by as little as a real device's members of one
    collective may differ: not read, rather than read wrong."""
    sizes = {DP: 2, TP: 2, PP: 4}
    grid = inferred(16, SHOWN_3D, _marks(sizes, (DP, PP, TP), drift_ns=4_000))
    assert isinstance(grid, str) and "neither together nor apart" in grid


def test_a_pipeline_alone_with_data_parallel_needs_no_timing() -> None:
    sizes = {DP: 4, TP: 1, PP: 4}
    marks = _marks(sizes, (DP, PP, TP), drift_ns=0)
    for mark in marks.values():
        mark.ends_ns = {}  # no activation-sized collective: none is read
    grid = inferred(16, frozenset({DP, PP}), marks)
    assert not isinstance(grid, str), grid
    assert (grid.sizes, grid.groups) == (sizes, grid_groups(sizes))


def test_no_first_stage_a_quarter_of_the_world_is_no_pipeline() -> None:
    marks = _marks({DP: 2, TP: 2, PP: 4}, (DP, PP, TP), drift_ns=20_000)
    marks[5].opens = {"send": 3}  # a fifth rank opening its steps by sending: 5 of 16
    grid = inferred(16, SHOWN_3D, marks)
    assert grid == "5 of 16 ranks open their steps with a send, which is no pipeline's first stage"


def test_an_old_folder_missing_a_trace_says_its_layout_unknown_and_why(tmp_path: Path) -> None:
    """Who opens each step and who keeps step with whom need every rank: with one trace lost
    the layout stays unknown, saying what the placement shows and why it was not read."""
    args = ["--layout", "dp=2,tp=2,pp=4", "-m", "8", "--steps", "3", "--format", "kineto",
            "--trace-shape", "old"]  # fmt: skip
    traces = simulate(tmp_path / "t", args)
    whole = load_any(traces).manifest
    assert (whole.layout.dp, whole.layout.tp, whole.layout.pp) == (2, 2, 4)
    assert whole.groups == grid_groups({DP: 2, TP: 2, PP: 4})
    lost = sorted(traces.glob("*.json*"))[5]
    shutil.move(lost, tmp_path / lost.name)
    manifest = load_any(traces).manifest
    assert str(manifest.layout_source).startswith("unknown: no process groups")
    assert "not read: the traces of 15 of 16 ranks" in str(manifest.layout_source)
    assert manifest.groups == {}


def test_a_step_opened_by_a_batch_holding_a_send_is_the_first_stages() -> None:
    """Megatron's interleaved first stage sends its first activations in one batch with a
    receive from the last stage (issued first); a later stage receives alone, and sends once
    it has computed."""

    def message(op: str, t0_us: int, step: int = 1) -> dict[str, object]:
        return {"op": op, "t0": t0_us * 1000, "t1": t0_us * 1000 + 500, "rank": 0, "step": step}

    first = [message("recv", 100), message("send", 104), message("recv", 2_000)]
    later = [message("recv", 100), message("send", 2_100), message("recv", 4_000)]
    assert marks(first, []).opens == {"send": 1}
    assert marks(later, []).opens == {"recv": 1}
