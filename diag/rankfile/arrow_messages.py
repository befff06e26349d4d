"""The metadata of an Arrow IPC message read without pyarrow: the Message flatbuffer's tables and
fields, its declared body length (what an incremental reader, diag/rankfile/tail.py, needs to
tell a message still being written from a whole one) and whether its batch is compressed.
On malformed metadata `body_length` answers None and `is_compressed` True (refused); the table
readers raise `struct.error`.
"""

from __future__ import annotations

import struct


def is_compressed(metadata: bytes) -> bool:
    """Whether an IPC record batch message declares compressed bodies (a flatbuffer:
    Message.header is a RecordBatch table whose field 3 is its BodyCompression). Malformed
    metadata counts as compressed (refused)."""
    try:
        message = flatbuffer_table(metadata, struct.unpack_from("<I", metadata, 0)[0])
        header = flatbuffer_field(metadata, message, 2)
        if header is None:
            return True
        batch = flatbuffer_table(metadata, header + struct.unpack_from("<I", metadata, header)[0])
        return flatbuffer_field(metadata, batch, 3) is not None
    except struct.error:
        return True


def flatbuffer_table(buffer: bytes, position: int) -> tuple[int, int]:
    """A flatbuffer table: its position and that of its vtable."""
    vtable = position - struct.unpack_from("<i", buffer, position)[0]
    if not 0 <= vtable < len(buffer):
        raise struct.error("vtable outside the buffer")
    return position, vtable


def flatbuffer_field(buffer: bytes, table: tuple[int, int], index: int) -> int | None:
    """Where field `index` of a table is stored, or None when absent."""
    position, vtable = table
    vtable_bytes = struct.unpack_from("<H", buffer, vtable)[0]
    slot = 4 + 2 * index
    if slot + 2 > vtable_bytes:
        return None
    offset = struct.unpack_from("<H", buffer, vtable + slot)[0]
    return position + offset if offset else None


def body_length(metadata: bytes) -> int | None:
    """The body length an IPC message's metadata (its Message flatbuffer) declares, 0 when the field
    is absent; None when the metadata is malformed (an incremental reader, diag/rankfile/tail.py,
    needs it to tell a message still being written from a whole one)."""
    try:
        message = flatbuffer_table(metadata, struct.unpack_from("<I", metadata, 0)[0])
        at = flatbuffer_field(metadata, message, 3)
        length = 0 if at is None else struct.unpack_from("<q", metadata, at)[0]
    except struct.error:
        return None
    return length if length >= 0 else None
