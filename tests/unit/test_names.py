"""The shared names of diag/contract/names.py: what the writers spell is what the readers match."""

from __future__ import annotations

import re

import pytest

from diag.contract.names import (
    EP_ALLTOALL_TAGS,
    GRID_AXES,
    PARALLEL_GROUPS,
    TP_BLOCKS,
    TP_LAYER_TAG,
    backward_tag,
    host_name,
    tp_tag,
)


@pytest.mark.parametrize("block", TP_BLOCKS)
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_the_tp_layer_tag_matches_what_tp_tag_writes(block: str, direction: str) -> None:
    tag = tp_tag(block, direction)  # type: ignore[arg-type]
    assert tag == f"tp.{block}.{direction}"
    match = re.match(TP_LAYER_TAG, tag)
    assert match is not None and match.group(1) == direction


@pytest.mark.parametrize("tag", [tp_tag("embed", "bwd"), tp_tag("head", "fwd"), "tp.sp_grads"])
def test_the_tp_layer_tag_leaves_out_what_is_not_a_layer(tag: str) -> None:
    assert re.match(TP_LAYER_TAG, tag) is None


def test_ep_tags_and_groups() -> None:
    assert EP_ALLTOALL_TAGS == ("dispatch", "combine", "dispatch.bwd", "combine.bwd")
    assert backward_tag("dispatch") == "dispatch.bwd"
    assert set(GRID_AXES) == set(PARALLEL_GROUPS) == {"dp", "tp", "pp", "ep"}
    assert GRID_AXES[-1] == "tp"  # tp innermost: adjacent ranks, one host


def test_host_name_is_rank_over_gpus_per_node() -> None:
    assert [host_name(r, 4) for r in (0, 3, 4, 9)] == ["node0", "node0", "node1", "node2"]


def test_grid_groups_vary_one_axis_each() -> None:
    from diag.contract.names import grid_groups

    groups = grid_groups({"dp": 2, "pp": 2, "tp": 2})
    assert groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups["world"] == [list(range(8))] and "ep" not in groups
