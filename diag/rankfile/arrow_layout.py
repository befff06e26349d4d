"""Where a record batch of the rank files' Arrow schema keeps its arrays: the field nodes and
buffers of `arrow_format.STREAM_SCHEMA` in the order the IPC format lists them (each array's
node, then its buffers: validity first; children after their parent, depth first), and where
in a batch message's metadata the numbers that change from batch to batch are.

Read by the compiled decoder (diag/rankfile/arrow_fast.py), which takes a message as this schema's
batch only when its metadata is the template's byte for byte outside those numbers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from diag.rankfile import arrow_encode
from diag.rankfile.arrow_format import STREAM_SCHEMA

LIST, STRUCT, FIXED, BOOL, STRING = range(5)
"""An array's layout: a list (validity, int32 offsets), a struct (validity), a fixed 8-byte
value (validity, data: int64 or float64), booleans (validity, bits), strings (validity,
int32 offsets, UTF-8 bytes)."""
BUFFERS = {LIST: 2, STRUCT: 1, FIXED: 2, BOOL: 2, STRING: 3}


@dataclass(frozen=True)
class Node:
    """One array of the schema: its Arrow type, layout, parent node (-1: a column) and first
    buffer."""

    type: pa.DataType
    layout: int
    parent: int
    first_buffer: int


def _layout_of(kind: pa.DataType) -> int:
    if pa.types.is_list(kind):
        return LIST
    if pa.types.is_struct(kind):
        return STRUCT
    if kind in (pa.int64(), pa.float64()):
        return FIXED
    if kind == pa.bool_():
        return BOOL
    if kind == pa.string():
        return STRING
    raise TypeError(f"no compiled layout for {kind}")


def schema_nodes(schema: pa.Schema = STREAM_SCHEMA) -> list[Node]:
    """The schema's arrays in IPC order."""
    nodes: list[Node] = []
    buffers = 0

    def visit(kind: pa.DataType, parent: int) -> None:
        nonlocal buffers
        layout = _layout_of(kind)
        nodes.append(Node(kind, layout, parent, buffers))
        here = len(nodes) - 1
        buffers += BUFFERS[layout]
        if layout == LIST:
            visit(kind.value_type, here)
        elif layout == STRUCT:
            for child in kind:
                visit(child.type, here)

    for column in schema:
        visit(column.type, -1)
    return nodes


NODES = schema_nodes()
BUFFER_COUNT = sum(BUFFERS[node.layout] for node in NODES)


@dataclass(frozen=True)
class Template:
    """A batch message as Arrow writes it for this schema (its 8-byte prefix and metadata),
    which of its words hold no number (the numbers: the body length, the nodes' lengths and
    null counts, the buffers' offsets and lengths) and where those numbers are."""

    message: np.ndarray
    """As int64 words."""
    fixed: np.ndarray
    """The indices of the words that hold no number (the same in every batch)."""
    body_at: int
    nodes_at: int
    buffers_at: int


def _template() -> Template:
    message = np.frombuffer(arrow_encode.PREFIX_AND_METADATA, dtype=np.uint8)
    body_at, nodes_at = arrow_encode.BODY_AT, arrow_encode.NODES_AT
    buffers_at = arrow_encode.BUFFERS_AT
    if arrow_encode.BUFFER_COUNT != BUFFER_COUNT:
        raise ImportError(f"Arrow lists {arrow_encode.BUFFER_COUNT} buffers, the layout "
                          f"{BUFFER_COUNT}")  # fmt: skip
    nodes_listed = int.from_bytes(message[nodes_at - 4 : nodes_at].tobytes(), "little")
    if nodes_listed != len(NODES):
        raise ImportError(f"Arrow lists {nodes_listed} field nodes, the layout {len(NODES)}")
    variable = np.zeros(len(message), dtype=np.uint8)
    variable[body_at : body_at + 8] = 1
    variable[nodes_at : nodes_at + 16 * len(NODES)] = 1
    variable[buffers_at : buffers_at + 16 * BUFFER_COUNT] = 1
    if any(at % 8 for at in (len(message), body_at, nodes_at, buffers_at)):
        raise ImportError("the batch template's numbers are not 8-byte aligned")
    fixed = np.flatnonzero(variable[::8] == 0).astype(np.int64)
    return Template(message.view(np.int64), fixed, body_at, nodes_at, buffers_at)


TEMPLATE = _template()
