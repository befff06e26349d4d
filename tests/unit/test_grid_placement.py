"""The grid of an older trace folder (no process groups) from the order and timing of its ops
(diag/read/kineto/grid_placement.py): the pipeline's first stage opens each step by sending,
tensor-parallel partners end every collective together, replicas drift apart."""

from __future__ import annotations

import json
import shutil
import time
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
    lasts = {g[-1] for g in groups.get(PP, [])}
    rng = np.random.default_rng(seed)
    out: dict[int, PlacementMarks] = {}
    tp_groups = groups.get(TP, [[r] for r in range(world)])
    for group in tp_groups:
        walk = np.cumsum(1_000_000 + rng.normal(0, drift_ns, size=32)).astype(np.int64)
        for r in group:
            opened = "send" if r in firsts or PP not in groups else "recv"
            # 16 micro-batches: a middle stage's activations and gradients go both ways
            messages = 32.0 if r in firsts or r in lasts else 64.0
            out[r] = PlacementMarks(
                {opened: 3},
                {s: [int(t) + offset_ns * (r % 2) for t in walk] for s in (1, 2)},
                messages,
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


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("drift_ns", [300, 1_500, 2_500])
def test_replicas_drifting_by_microseconds_leave_the_split_unknown(
    seed: int, drift_ns: int
) -> None:
    """A small model's replicas drift apart by as little as a real device's members of one
    collective may differ: not read, rather than read wrong."""
    sizes = {DP: 2, TP: 2, PP: 4}
    grid = inferred(16, SHOWN_3D, _marks(sizes, (DP, PP, TP), drift_ns=drift_ns, seed=seed))
    assert isinstance(grid, str)
    said = ("neither together nor apart", "keep step at every collective", "fit no grid")
    assert any(s in grid for s in said), grid


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
    assert isinstance(grid, str) and "fit no grid" in grid


def _without_sizes(folder: Path) -> None:
    """An older trace still: no `Input Dims` or `Input type` either (no op's size)."""
    for path in folder.glob("*.json"):
        trace = json.loads(path.read_text())
        for event in trace["traceEvents"]:
            for key in ("Input Dims", "Input type"):
                event.get("args", {}).pop(key, None)
        path.write_text(json.dumps(trace))


def test_an_old_folders_grid_with_no_sizes_and_with_traces_missing(tmp_path: Path) -> None:
    """Without sizes no data parallelism shows (the gradients' all-reduces are the activations'
    op): the lockstep groups still say tp, so the world is not read as tp=4 x pp=4. With a
    trace lost, or one per tensor-parallel group written, the traced ranks still fit one grid
    only."""
    args = ["--layout", "dp=2,tp=2,pp=4", "-m", "8", "--steps", "3", "--format", "kineto",
            "--trace-shape", "old"]  # fmt: skip
    traces = simulate(tmp_path / "t", args)
    _without_sizes(traces)
    truth = grid_groups({DP: 2, TP: 2, PP: 4})
    whole = load_any(traces).manifest
    assert "data-parallel gradient" not in str(whole.layout_source)  # not shown without sizes
    assert (whole.layout.dp, whole.layout.tp, whole.layout.pp) == (2, 2, 4)
    assert whole.groups == truth
    files = sorted(traces.glob("*.json"), key=lambda p: int(p.stem.split("_")[1].split(".")[0]))
    shutil.move(files[5], tmp_path / files[5].name)  # rank 5's
    lost = load_any(traces).manifest
    assert lost.groups == truth
    assert "the only grid the 15 of 16 ranks traced fit" in str(lost.layout_source)
    for odd in files[1::2]:  # one per TP group: ranks 0, 2, 4 ...
        if odd.exists():
            odd.unlink()
    half = load_any(traces).manifest
    assert half.groups == truth, half.layout_source


def test_traced_ranks_that_fit_several_grids_leave_the_layout_unknown() -> None:
    """One rank per tensor-parallel group of 8 (32 of 256): groups of 2, 4 or 8 fit the first
    stage and the groups alike (with 16 or 32 stages); without the messages a step, none is
    claimed; a fifth lost at random fits the truth only."""
    sizes = {DP: 4, TP: 8, PP: 8}
    every = _marks(sizes, (DP, PP, TP), drift_ns=20_000)
    one_per_tp = {r: m for r, m in every.items() if r % 8 == 0}
    uncounted = {r: PlacementMarks(m.opens, m.ends_ns) for r, m in one_per_tp.items()}
    grid = inferred(256, SHOWN_3D, uncounted)
    assert grid == ("the traces of 32 of 256 ranks fit 3 grids (dp4 x tp8 x pp8; "
                    "dp4 x tp4 x pp16; dp4 x tp2 x pp32)")  # fmt: skip
    rng = np.random.default_rng(1)
    lost = set(rng.choice(256, size=51, replace=False).tolist())
    some = {r: m for r, m in every.items() if r not in lost}
    read = inferred(256, SHOWN_3D, some)
    assert not isinstance(read, str), read
    assert (read.sizes, read.groups) == (sizes, grid_groups(sizes))


def test_the_last_stage_tells_the_grids_one_rank_per_tp_group_fits() -> None:
    """One rank per tensor-parallel group of 8 (32 of 256, data parallelism outermost): the
    ranks whose steps hold the fewest messages without opening with a send are the last
    stage; only 8 stages put a traced rank there (with 16 or 32, the last stage's ranks are
    never the traced ones). With the pipeline outermost the grids that fit differ in dp and
    tp alone, within a stage, which no rank traced per group can tell: unknown."""
    sizes = {DP: 4, TP: 8, PP: 8}
    order = (DP, PP, TP)
    one_per_tp = {r: m for r, m in _marks(sizes, order, 20_000).items() if r % 8 == 0}
    grid = inferred(256, SHOWN_3D, one_per_tp)
    assert not isinstance(grid, str), grid
    assert (grid.sizes, grid.groups) == (sizes, grid_groups(sizes, order))
    assert "4 of them the last stage (the fewest messages a step" in grid.how
    # no middle stage traced (only the first and last): nothing to tell the last by
    ends = {r: m for r, m in one_per_tp.items() if _stage(r, sizes, order) in (0, 7)}
    assert isinstance(inferred(256, SHOWN_3D, ends), str)
    megatron = (PP, DP, TP)
    within = {r: m for r, m in _marks(sizes, megatron, 20_000).items() if r % 8 == 0}
    assert inferred(256, SHOWN_3D, within) == (
        "the traces of 32 of 256 ranks fit 3 grids (dp16 x tp2 x pp8; dp8 x tp4 x pp8; "
        "dp4 x tp8 x pp8)"
    )


def _stage(rank: int, sizes: dict[str, int], order: tuple[str, ...]) -> int:
    """The rank's pipeline stage in the grid."""
    groups = grid_groups(sizes, order)[PP]
    return next(g.index(rank) for g in groups if rank in g)


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


def test_a_world_of_a_million_ranks_is_never_laid_out_to_test_a_grid() -> None:
    """Hostile input: a folder of two old traces claiming the largest world allowed (2**20
    ranks). Every grid is tested on the traced ranks alone, so the answer (unknown: too few
    traced to tell) comes at once rather than after laying out 2**20 ranks per grid."""
    ends = {1: [1_000, 2_000, 3_000], 2: [4_000, 5_000, 6_000]}
    marks_of = {0: PlacementMarks({"send": 3}, ends), 5: PlacementMarks({"recv": 3}, ends)}
    started = time.monotonic()
    grid = inferred(2**20, SHOWN_3D, marks_of)
    assert isinstance(grid, str) and "the traces of 2 of 1048576 ranks fit 35 grids" in grid
    assert time.monotonic() - started < 5  # a bound on a hang, not a speed claim
