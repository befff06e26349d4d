"""A gloo collective's bytes from the shapes the profiler recorded (gloo_sizes.py), as torch
2.13 writes them on gloo (`record_shapes=True`, read from a real 2-rank job's trace): the
`gloo:` event's tensor, typed, and the issuing `c10d::` op's arguments, a tensor list
untyped. The real job's path is tests/distributed/test_traces_agree.py."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from diag.contract.limits import MAX_ARG_INTEGER
from diag.read.kineto.events import Args
from diag.read.kineto.gloo_sizes import message_bytes, tensor_sizes


def shapes(dims: list[Any], types: list[Any]) -> Args:
    return Args(input_dims=dims, input_type=types)


GATHER_EVENT = shapes([[1000]], ["float"])  # `gloo:all_gather`: one rank's part
GATHER_OP = shapes([[2000], [1000], [], []], ["float", "float", "", "Scalar"])
REDUCE_OP = shapes([[[1000]], [], [], [], [], []], ["TensorList", "", "", "", "Scalar", "Scalar"])


def test_an_all_reduce_reads_its_own_tensor_and_its_ops_untyped_list() -> None:
    assert message_bytes("all_reduce", shapes([[2000]], ["double"]), None) == (16000, "double")
    # the op's list is counted at the event's dtype
    assert message_bytes("all_reduce", shapes([[1000]], ["float"]), REDUCE_OP) == (4000, "float")
    assert message_bytes("all_reduce", None, REDUCE_OP) == (None, None)  # no dtype anywhere


def test_an_all_gather_is_its_whole_output_or_unknown() -> None:
    assert message_bytes("all_gather", GATHER_EVENT, GATHER_OP) == (8000, "float")
    assert message_bytes("all_gather", GATHER_EVENT, None) == (None, None)  # a part only


def test_a_reduce_scatter_is_its_whole_input() -> None:
    op = shapes([[500], [1000], [], [], [], []], ["float", "float", "", "", "Scalar", "Scalar"])
    assert message_bytes("reduce_scatter", shapes([[1000]], ["float"]), op) == (4000, "float")


def test_lists_of_tensors_are_summed_and_bad_shapes_are_unknown() -> None:
    assert tensor_sizes(shapes([[[2, 3], [4]], [5]], ["TensorList", "c10::BFloat16"])) == [
        (10, ""), (5, "bfloat16")]  # fmt: skip
    assert tensor_sizes(shapes([[[[[1]]]]], ["TensorList"])) is None  # nested too deep
    assert tensor_sizes(shapes([[2**40, 2**40]], ["float"])) is None  # a product too large
    assert tensor_sizes(shapes([[1, "x"]], ["float"])) is None
    assert tensor_sizes(shapes([[1]] * 65, ["float"] * 65)) is None  # too many tensors
    assert tensor_sizes(shapes("[[1]]", ["float"])) is None
    assert message_bytes("all_reduce", shapes([[3]], ["complex"]), None) == (None, None)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(JSON, JSON, st.sampled_from(["all_reduce", "all_gather", "send"]))
def test_any_shapes_give_bounded_bytes_or_none(dims: Any, types: Any, op: str) -> None:
    found, dtype = message_bytes(op, shapes(dims, types), shapes(types, dims))
    assert found is None or (0 <= found < MAX_ARG_INTEGER and isinstance(dtype, str))
