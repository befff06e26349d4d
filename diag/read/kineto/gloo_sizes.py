"""The bytes of a collective on gloo, read from the shapes the profiler recorded (issue 39).

gloo's collectives carry no `record_param_comms` sizes. With `record_shapes=True`, though,
the profiler writes `Input Dims` and `Input type` on both sides of one:
- the `gloo:<op>` event (the backend's work, on its worker thread): the tensor it runs on,
  typed (`[[321271]]`, `["float"]`); for an all-gather that is one rank's part only;
- the `c10d::<op>` operator that issued it (the caller's thread): every tensor argument, the
  output too (`_allgather_base_`: `[[2000], [1000]]`), but a tensor list untyped
  (`allreduce_`: `[[[1000]]]`, `["TensorList"]`).
A collective's bytes are what `record_param_comms` would say (`max(In msg nelems, Out msg
nelems)` x the element's size, comm_ops.collective): the largest tensor argument of either
side, an untyped list's elements at the dtype the other side names. An all-gather with no
issuing operator found is unknown (its own event holds a part), as is any shape that is not
a list of counts. Nothing here trusts the trace: lengths, depth and products are bounded.
"""

from __future__ import annotations

from typing import Any

from diag.contract.limits import MAX_ARG_INTEGER
from diag.read.kineto.comm_ops import DTYPE_BYTES, MAX_TENSORS, count, label
from diag.read.kineto.events import Args

MAX_LIST_DEPTH = 3
"""A shape nested deeper than a list of tensor lists (`allgather_`'s `[[[n], [n]]]`) is not
read: its bytes stay unknown."""
PART_ONLY = frozenset({"all_gather"})
"""Ops whose gloo event's own tensor is one rank's part, not the message."""


def message_bytes(op: str, own: Args | None, issuer: Args | None) -> tuple[int | None, str | None]:
    """(bytes, dtype) of a gloo collective from its `gloo:` event's arguments (`own`) and its
    issuing `c10d::` operator's (`issuer`, None where none was matched); (None, None) where
    neither says (the module's docstring)."""
    own_sizes = tensor_sizes(own) if own is not None else None
    issuer_sizes = tensor_sizes(issuer) if issuer is not None else None
    typed = [dtype for sizes in (own_sizes, issuer_sizes) for _, dtype in sizes or () if dtype]
    dtype = typed[0] if typed else ""
    candidates = list(issuer_sizes or ())
    if op not in PART_ONLY or issuer_sizes:
        candidates += own_sizes or ()
    found = [n * DTYPE_BYTES[kind or dtype] for n, kind in candidates if kind or dtype]
    if not found:
        return None, None
    return min(max(found), MAX_ARG_INTEGER - 1), dtype or None


def tensor_sizes(args: Args) -> list[tuple[int, str]] | None:
    """(elements, dtype) of each tensor argument of `Input Dims` x `Input type`: a tensor
    list's elements summed, with dtype "" (its type reads `TensorList`); a scalar or a
    non-tensor argument (`[]`) left out. None where a shape is not a list of counts or the
    lists are too long."""
    dims, types = args.input_dims, args.input_type
    if type(dims) is not list or type(types) is not list or len(dims) > MAX_TENSORS:
        return None
    sizes: list[tuple[int, str]] = []
    for shape, kind in zip(dims, types, strict=False):
        if type(shape) is not list or not shape:
            continue
        elements = _elements(shape, MAX_LIST_DEPTH)
        if elements is None:
            return None
        dtype = label(kind).lower().removeprefix("c10::")
        listed = type(shape[0]) is list
        sizes.append((elements, "" if listed or dtype not in DTYPE_BYTES else dtype))
    return sizes


def _elements(shape: list[Any], depth: int) -> int | None:
    """A shape's element count, or a list of shapes' summed; None past `depth` levels, past
    MAX_TENSORS entries, or where an extent is not a count."""
    if depth <= 0 or len(shape) > MAX_TENSORS:
        return None
    if all(type(item) is list for item in shape):
        total = 0
        for item in shape:
            part = _elements(item, depth - 1) if item else 1  # `[]`: a 0-d tensor
            if part is None:
                return None
            total += part
        return total if total < MAX_ARG_INTEGER else None
    product = 1
    for extent in shape:
        product *= count(extent, default=-1)
        if not 0 <= product < MAX_ARG_INTEGER:
            return None
    return product
