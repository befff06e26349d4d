"""The ZeRO stage and gradient accumulation of a trace folder's job: read from its
data-parallel collectives where they say them (diag/read/kineto/sharding.py), else null in the
report, never the defaults 0 and 1; given with `--layout zero=N,ga=N`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from diag.api import analyze_path, load_any
from diag.cli.main import main
from diag.cli.options import parse_layout
from diag.contract import schema
from diag.read.kineto import placement
from diag.read.kineto.events import Args
from diag.read.kineto.sharding import read_zero_stage

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "real-traces"
WORLD2 = REAL / "hta-nccl-world2"
DP = [[0, 1]]


def _rows(*steps: list[tuple[str, int]], ranks: tuple[int, ...] = (0, 1)) -> list[Any]:
    """Each rank's collectives of the world group [0, 1], step by step: (op, start) pairs."""
    return [
        ({"op": op, "t0": t0, "rank": rank, "step": number, "group_ranks": (0, 1)}, 1)
        for rank in ranks
        for number, ops in enumerate(steps)
        for op, t0 in ops
    ]


FSDP = [("all_gather", 1), ("all_gather", 2), ("all_gather", 5), ("reduce_scatter", 6),
        ("all_gather", 7), ("reduce_scatter", 8)]  # fmt: skip
"""Two layers: gathered for the forward and again for the backward, reduced once each."""
DDP = [("all_reduce", 5), ("all_reduce", 6)]
MEGATRON_DISTRIBUTED_OPTIMIZER = [("reduce_scatter", 5), ("reduce_scatter", 6),
                                  ("all_gather", 8), ("all_gather", 9)]  # fmt: skip


def test_full_sharding_is_zero_3() -> None:
    stage, why = read_zero_stage(_rows(FSDP, FSDP), DP, only_dp=False)
    assert stage == 3, why
    assert "4 times a step against 2" in why


def test_all_reduces_only_are_zero_0() -> None:
    assert read_zero_stage(_rows(DDP, DDP), DP, only_dp=False)[0] == 0


def test_a_gather_and_a_reduction_each_is_zero_1_or_2_unknown() -> None:
    stage, why = read_zero_stage(_rows(MEGATRON_DISTRIBUTED_OPTIMIZER), DP, only_dp=False)
    assert stage is None and "ZeRO-1 or 2" in why
    # the parameters gathered for the next forward (overlapped): before the reductions, but
    # as many gathers as reductions: still no third stage
    overlapped = [("all_gather", 1), ("all_gather", 2), ("reduce_scatter", 5),
                  ("reduce_scatter", 6)]  # fmt: skip
    assert read_zero_stage(_rows(overlapped), DP, only_dp=False)[0] is None


def test_steps_that_disagree_and_other_groups_say_nothing() -> None:
    stage, why = read_zero_stage(_rows(FSDP, DDP), DP, only_dp=False)
    assert stage is None and "differ" in why
    # collectives of a group that is not data parallel (a tensor-parallel pair) are not read
    assert read_zero_stage(_rows(FSDP), [[0, 2]], only_dp=False)[0] is None
    # unless data parallel is the job's only axis (older traces name no group's ranks)
    unnamed = [({**row, "group_ranks": None}, n) for row, n in _rows(FSDP)]
    assert read_zero_stage(unnamed, None, only_dp=True)[0] == 3
    assert read_zero_stage(unnamed, None, only_dp=False)[0] is None


def test_layout_option_takes_zero_and_accumulation() -> None:
    layout = parse_layout("dp=2,zero=3,ga=4")
    assert layout is not None and (layout.zero_stage, layout.grad_accum) == (3, 4)
    unsaid = parse_layout("dp=2")
    assert unsaid is not None
    assert (unsaid.zero_stage, unsaid.grad_accum) == (schema.NOT_GIVEN_ZERO, 0)
    assert parse_layout("zero=0") is not None
    with pytest.raises(click.BadParameter, match="ZeRO stage is 0, 1, 2 or 3"):
        parse_layout("dp=2,zero=4")
    with pytest.raises(click.BadParameter, match="at least 1"):
        parse_layout("dp=2,ga=0")


@pytest.mark.skipif(not WORLD2.is_dir(), reason="real Kineto traces not present")
def test_a_real_ddp_trace_reads_zero_0_and_null_accumulation() -> None:
    report = analyze_path(WORLD2)
    layout = report["run"]["layout"]
    assert layout["zero_stage"] == 0 and layout["grad_accum"] is None
    assert "ZeRO-0 read: 5 gradient all-reduces a step" in report["run"]["layout_source"]
    given = load_any(WORLD2, parse_layout("dp=2,zero=2,ga=4")).manifest
    assert (given.layout.zero_stage, given.layout.grad_accum) == (2, 4)
    assert given.zero_known and given.accumulation_known and given.schedule_known
    # a layout given without them: the stage read, the accumulation unknown
    partly = load_any(WORLD2, parse_layout("dp=2")).manifest
    assert partly.layout.zero_stage == 0 and partly.zero_known
    assert not partly.accumulation_known


@pytest.mark.skipif(not WORLD2.is_dir(), reason="real Kineto traces not present")
def test_plan_from_traces_asks_for_what_they_do_not_say() -> None:
    result = CliRunner().invoke(main, ["plan", "--from", str(WORLD2), "--run-layout", "dp=2"])
    assert result.exit_code == 2
    assert "gradient accumulation" in result.output and "ga=N" in result.output


def test_parameters_gathered_in_the_forward_pass_are_not_tensor_parallel() -> None:
    """FSDP's forward waits on each layer's all-gather, early in the step like a TP
    all-reduce; only gathers there (no activation reduced) read as data parallel, so a loaded
    run whose first gathers block in the step's first quarter keeps its layout."""
    steps = [{"rank": r, "step": 0, "t0": 0, "t1": 1000} for r in (0, 1)]

    def comm(rank: int, op: str, t0: int) -> dict[str, Any]:
        return {"rank": rank, "step": 0, "op": op, "t0": t0, "bytes": None, "blocking": True}

    ops = (("all_gather", 10), ("all_gather", 100), ("all_gather", 600), ("all_reduce", 700))
    fsdp = [comm(r, op, t0) for r in (0, 1) for op, t0 in ops]
    assert placement.kinds_shown(fsdp, steps) == {"dp"}
    # an activation reduced in the forward pass too: tensor parallel is seen, as before
    tp = [*fsdp, comm(0, "all_reduce", 50), comm(1, "all_reduce", 50)]
    assert "tp" in placement.kinds_shown(tp, steps)


def test_the_headline_says_the_stage_read_and_not_its_evidence() -> None:
    from diag.outputs.report_lines import _layout_source

    source = (
        "from the traces' process groups (the world's only; ...); schedule read: m=4, v=1 (4 "
        "sends ...); ZeRO-3 read: parameters all-gathered 5 times a step ..."
    )
    (line,) = _layout_source({"layout_source": source})
    assert line == ("layout from the traces' process groups, m=4, v=1 read from the sends per "
                    "step, ZeRO-3 read from the collectives")  # fmt: skip
    unknown = "given; ZeRO stage unknown: 4 parameter all-gathers and 4 gradient reductions"
    assert _layout_source({"layout_source": unknown}) == ["layout given"]


def test_a_gloo_event_is_named_by_the_c10d_op_that_issued_it() -> None:
    """gloo runs `c10d::_reduce_scatter_base_` as an all-reduce (its event `gloo:all_reduce`):
    the op is the CPU side's, so FSDP's gradient reduce-scatters read as reduce-scatters; an
    all-reduce DDP issued stays one, and an event no c10d op issued keeps its own name."""
    from diag.read.kineto.convert import NO_ARGS, RankEvents, gloo_ops

    rank = RankEvents()
    gather, scatter, reduce = Args(collective="g"), Args(collective="s"), Args(collective="r")
    rank.c10d = [("_allgather_base_", 10, gather), ("_reduce_scatter_base_", 30, scatter),
                 ("allreduce_", 50, reduce)]  # fmt: skip
    rank.gloo = [
        ("all_gather", 12, 20, 7, NO_ARGS), ("all_reduce", 33, 40, 8, NO_ARGS),
        ("all_reduce", 52, 60, 7, NO_ARGS), ("all_reduce", 90, 95, 7, NO_ARGS),
    ]  # fmt: skip
    assert gloo_ops(rank) == [("all_gather", gather), ("reduce_scatter", scatter),
                              ("all_reduce", reduce), ("all_reduce", None)]  # fmt: skip


def test_the_order_is_read_where_the_times_are() -> None:
    """The layout's counts keep a collective's start only as early or late in its step; a
    rank whose forward starts late (a straggler's sleep first, a later pipeline stage) has
    its gathers and reductions both late. Whether a gather came before the rank-step's first
    reduction is flagged by the reader from the real times (packed_comms.gathers_ahead)."""
    from diag.read.kineto.packed_comms import gathers_ahead

    def comm(op: str, t0: int, step: int = 0) -> dict[str, Any]:
        return {"op": op, "t0": t0, "rank": 0, "step": step, "group_ranks": (0, 1)}

    comms = [comm("all_gather", 5), comm("reduce_scatter", 9), comm("all_gather", 12),
             comm("all_gather", 3, step=1)]  # fmt: skip
    assert gathers_ahead(comms) == {0: True, 2: False, 3: True}
    late = [({**row, "t0": 1000, "ahead": op == "all_gather" and row["t0"] < 5}, n)
            for row, n in _rows(FSDP) for op in [row["op"]]]  # fmt: skip
    assert read_zero_stage(late, DP, only_dp=False)[0] == 3
