"""Read a pickle that may only hold plain data, by hand: no `pickle` module, nothing resolved.

Loading a pickle with the standard unpickler runs whatever callable it names (`os.system`
through `__reduce__`). This reader walks the opcodes itself and knows only those that build
plain values: dicts, lists, tuples, sets, str, bytes, ints, floats, bools and None, the memo
(PUT, GET, MEMOIZE), frames and marks (MARK, APPENDS, SETITEMS, ...), in every protocol a
PyTorch Flight Recorder dump uses (its C++ pickler writes protocol 2; Python's writes 4 or 5;
the simple text opcodes of 0 and 1 are read too). Every opcode that names or calls something
(GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, the
extension registry's EXT codes, out-of-band buffers) is refused with its name, and so is any
opcode it does not know: what loads is built from the pickle's own containers and scalars.

Bounded everywhere: the input's bytes before reading, each length an opcode declares against
what is left (a 2**63-byte string is refused, not allocated), an integer's digits, the memo's
entries, the marks open at once (the nesting a pickle builds as it goes) and, after loading,
an iterative walk that counts every value reached (a shared list counts each time: a few bytes
of pickle can reference one list 2**60 times) and its nesting depth. A loop over the opcodes,
a stack and a memo: no recursion anywhere.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

PLAIN_SCALARS = (str, bytes, int, float, bool, type(None))
MAX_MEMO = 2**20
"""Memo entries kept at once: a dump memoises each container and string it repeats."""
MAX_INT_BYTES = 64
"""An integer's bytes (LONG1, LONG4) or digits (INT, LONG): a dump's are 64-bit."""
MAX_TEXT_LINE = 2**16
"""A text opcode's line (protocol 0's INT, LONG, FLOAT, PUT, GET, UNICODE)."""


class RefusedPickle(ValueError):
    """The pickle names a callable or a persistent object, is too large, too deep, or not plain."""


class _Mark:
    """The marker MARK pushes (a distinct object: no plain value is one)."""


_MARK = _Mark()

REFUSED = {
    b"c": "GLOBAL", b"\x93": "STACK_GLOBAL", b"i": "INST", b"o": "OBJ", b"R": "REDUCE",
    b"b": "BUILD", b"\x81": "NEWOBJ", b"\x92": "NEWOBJ_EX", b"\x82": "EXT1", b"\x83": "EXT2",
    b"\x84": "EXT4",
}  # fmt: skip
"""Opcodes that name a global or call one: refused, so nothing in the pickle can run."""
PERSISTENT = {b"P": "PERSID", b"Q": "BINPERSID"}
BUFFERS = {b"\x97": "NEXT_BUFFER", b"\x98": "READONLY_BUFFER", b"\x96": "BYTEARRAY8"}
"""Out-of-band buffers and bytearrays: not plain data (a dump holds none)."""


def load_plain(
    data: bytes, max_bytes: int, max_objects: int, max_depth: int, max_memo: int = MAX_MEMO
) -> Any:
    """The plain value pickled in `data`; RefusedPickle (the reason, one line) on anything else."""
    if len(data) > max_bytes:
        raise RefusedPickle(f"{len(data):,} bytes, above the limit of {max_bytes:,}")
    value = _Reader(bytes(data), max_depth, max_memo).load()
    check_plain(value, max_objects, max_depth)
    return value


class _Reader:
    """One pass over the opcodes: `stack` holds the values built so far, `marks` where each
    open MARK began, `memo` what PUT kept for GET."""

    def __init__(self, data: bytes, max_depth: int, max_memo: int) -> None:
        self.data = data
        self.pos = 0
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.max_marks = max_depth
        self.max_memo = max_memo

    def load(self) -> Any:
        data, stack, memo, marks = self.data, self.stack, self.memo, self.marks
        size = len(data)
        while True:
            pos = self.pos
            if pos >= size:
                raise self.broken("ends before its STOP opcode")
            code = data[pos]
            # the opcodes a dump is mostly made of, read inline (a dump of 2,000 entries with
            # their stacks is a million opcodes); each checks what its handler would
            if code == 0x8C and pos + 1 < size:  # SHORT_BINUNICODE
                end = pos + 2 + data[pos + 1]
                if end <= size:
                    try:
                        stack.append(data[pos + 2 : end].decode("utf-8", "surrogatepass"))
                    except UnicodeDecodeError:
                        raise self.broken("a string that is not UTF-8") from None
                    self.pos = end
                    continue
            elif code == 0x94 and stack and (not marks or len(stack) > marks[-1]):  # MEMOIZE
                if len(memo) < self.max_memo:
                    memo[len(memo)] = stack[-1]
                    self.pos = pos + 1
                    continue
            elif code == 0x68 and pos + 1 < size and data[pos + 1] in memo:  # BINGET
                stack.append(memo[data[pos + 1]])
                self.pos = pos + 2
                continue
            elif code == 0x4B and pos + 1 < size:  # BININT1
                stack.append(data[pos + 1])
                self.pos = pos + 2
                continue
            elif code == 0x4E:  # NONE
                stack.append(None)
                self.pos = pos + 1
                continue
            self.pos = pos + 1
            opcode = data[pos : pos + 1]
            if opcode == b".":  # STOP
                if len(stack) != 1 or marks:
                    raise self.broken("its STOP leaves no single value")
                return stack[0]
            handler = _HANDLERS.get(opcode)
            if handler is None:
                raise self.refuse(self.why_refused(opcode))
            handler(self)

    # --- reading the stream ---------------------------------------------------------------------

    def refuse(self, reason: str) -> RefusedPickle:
        return RefusedPickle(f"{reason} (byte {self.pos:,}): refused, nothing run")

    def broken(self, reason: str) -> RefusedPickle:
        return RefusedPickle(f"not a readable pickle: {reason} (byte {self.pos:,})")

    def why_refused(self, code: bytes) -> str:
        if code == b"c":  # GLOBAL: module and name follow as two lines; shown, never resolved
            lines = self.data[self.pos : self.pos + 200].split(b"\n", 2)[:2]
            return f"names a global ({b'.'.join(lines).decode('ascii', 'replace')})"
        if code == b"\x93" and len(self.stack) >= 2:  # STACK_GLOBAL: module, name on the stack
            return f"names a global ({'.'.join(str(p)[:80] for p in self.stack[-2:])})"
        if code in REFUSED:
            return f"names a global or calls one ({REFUSED[code]})"
        if code in PERSISTENT:
            return f"holds a persistent id ({PERSISTENT[code]})"
        if code in BUFFERS:
            return f"holds an out-of-band buffer or bytearray ({BUFFERS[code]}), not plain data"
        return f"opcode {code!r} is not one of plain data"

    def take(self, count: int) -> bytes:
        if count < 0 or count > len(self.data) - self.pos:
            raise self.broken(f"an opcode declares {count:,} bytes, more than the pickle holds")
        chunk = self.data[self.pos : self.pos + count]
        self.pos += count
        return chunk

    def unsigned(self, width: int) -> int:
        return int.from_bytes(self.take(width), "little")

    def line(self) -> bytes:
        end = self.data.find(b"\n", self.pos, self.pos + MAX_TEXT_LINE)
        if end < 0:
            raise self.broken("a text opcode's line has no end within the limit")
        chunk = self.data[self.pos : end]
        self.pos = end + 1
        return chunk

    # --- the stack ------------------------------------------------------------------------------

    def push(self, value: Any) -> None:
        self.stack.append(value)

    def pop(self) -> Any:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise self.broken("pops an empty stack")
        return self.stack.pop()

    def top(self) -> Any:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise self.broken("reads an empty stack")
        return self.stack[-1]

    def mark(self) -> None:
        if len(self.marks) >= self.max_marks:
            raise self.refuse(f"nested deeper than {self.max_marks} levels")
        self.marks.append(len(self.stack))

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise self.broken("closes a MARK it never opened")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def put(self, index: int) -> None:
        if index not in self.memo and len(self.memo) >= self.max_memo:
            raise self.refuse(f"more than {self.max_memo:,} memo entries")
        self.memo[index] = self.top()

    def get(self, index: int) -> None:
        if index not in self.memo:
            raise self.broken(f"reads memo entry {index}, never put")
        self.push(self.memo[index])

    def number(self) -> int:
        text = self.line().rstrip(b"L")
        if len(text) > MAX_INT_BYTES or not text.lstrip(b"-+").isdigit():
            raise self.broken("a text integer that is not a short decimal")
        return int(text)

    def set_items(self, target: dict[Any, Any], items: list[Any]) -> None:
        if len(items) % 2:
            raise self.broken("SETITEMS with a key and no value")
        for key, value in zip(items[::2], items[1::2], strict=True):
            target[self.key(key)] = value

    def key(self, key: Any) -> Any:
        if not isinstance(key, PLAIN_SCALARS):
            raise self.refuse("a dict key or set item is not a plain scalar")
        return key


def _long(reader: _Reader, width: int) -> None:
    count = reader.unsigned(width)
    if count > MAX_INT_BYTES:
        raise reader.refuse(f"an integer of {count:,} bytes, above the limit of {MAX_INT_BYTES}")
    reader.push(int.from_bytes(reader.take(count), "little", signed=True))


def _text(reader: _Reader, width: int) -> None:
    raw = reader.take(reader.unsigned(width))
    try:
        reader.push(raw.decode("utf-8", "surrogatepass"))
    except UnicodeDecodeError:
        raise reader.broken("a string that is not UTF-8") from None


def _ascii(reader: _Reader, width: int) -> None:
    """SHORT_BINSTRING, BINSTRING: Python 2's str, read as Python's unpickler does (ASCII)."""
    raw = reader.take(reader.unsigned(width))
    try:
        reader.push(raw.decode("ascii"))
    except UnicodeDecodeError:
        raise reader.broken("a protocol-1 string that is not ASCII") from None


def _int_line(reader: _Reader) -> None:
    text = reader.line()
    if text in (b"00", b"01"):  # protocol 0's False and True
        reader.push(text == b"01")
        return
    reader.pos -= len(text) + 1
    reader.push(reader.number())


def _float_line(reader: _Reader) -> None:
    text = reader.line()
    try:
        reader.push(float(text[:MAX_INT_BYTES].decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        raise reader.broken("a text float that is not a number") from None


def _unicode_line(reader: _Reader) -> None:
    try:
        reader.push(reader.line().decode("raw-unicode-escape"))
    except UnicodeDecodeError:
        raise reader.broken("a text string that does not decode") from None


def _tuple(reader: _Reader, size: int) -> None:
    items = [reader.pop() for _ in range(size)]
    reader.push(tuple(reversed(items)))


def _top_of(reader: _Reader, kind: type, does: str) -> Any:
    """The container on top of the stack, which an opcode that `does` something to it needs
    to be a `kind` (exactly: no subclass is plain data)."""
    target = reader.top()
    if type(target) is not kind:
        raise reader.broken(f"{does} a {type(target).__name__}, not a {kind.__name__}")
    return target


def _append(reader: _Reader) -> None:
    value = reader.pop()
    _top_of(reader, list, "appends to").append(value)


def _extend(reader: _Reader) -> None:
    items = reader.pop_mark()
    _top_of(reader, list, "appends to").extend(items)


def _set_item(reader: _Reader) -> None:
    value, key = reader.pop(), reader.pop()
    _top_of(reader, dict, "sets an item of")[reader.key(key)] = value


def _set_items(reader: _Reader) -> None:
    items = reader.pop_mark()
    reader.set_items(_top_of(reader, dict, "sets items of"), items)


def _dict_from_mark(reader: _Reader) -> None:
    built: dict[Any, Any] = {}
    reader.set_items(built, reader.pop_mark())
    reader.push(built)


def _add_items(reader: _Reader) -> None:
    items = reader.pop_mark()
    _top_of(reader, set, "adds items to").update(reader.key(item) for item in items)


def _frozenset(reader: _Reader) -> None:
    reader.push(frozenset(reader.key(item) for item in reader.pop_mark()))


def _pop(reader: _Reader) -> None:
    if reader.marks and len(reader.stack) == reader.marks[-1]:
        reader.marks.pop()  # POP of a MARK on top: pickle's own reading
        return
    reader.pop()


def _proto(reader: _Reader) -> None:
    version = reader.unsigned(1)
    if version > 5:
        raise reader.refuse(f"pickle protocol {version}, above 5")


def _frame(reader: _Reader) -> None:
    size = reader.unsigned(8)
    if size > len(reader.data) - reader.pos:
        raise reader.broken(f"a frame of {size:,} bytes, more than the pickle holds")


def _int4(reader: _Reader) -> None:
    reader.push(struct.unpack("<i", reader.take(4))[0])


def _float8(reader: _Reader) -> None:
    reader.push(struct.unpack(">d", reader.take(8))[0])


def _bytes(reader: _Reader, width: int) -> None:
    reader.push(reader.take(reader.unsigned(width)))


_LENGTH_PREFIXED: dict[bytes, tuple[Callable[[_Reader, int], None], int]] = {
    b"\x8a": (_long, 1),  # LONG1
    b"\x8b": (_long, 4),  # LONG4
    b"U": (_ascii, 1),  # SHORT_BINSTRING
    b"T": (_ascii, 4),  # BINSTRING
    b"C": (_bytes, 1),  # SHORT_BINBYTES
    b"B": (_bytes, 4),  # BINBYTES
    b"\x8e": (_bytes, 8),  # BINBYTES8
    b"\x8c": (_text, 1),  # SHORT_BINUNICODE
    b"X": (_text, 4),  # BINUNICODE
    b"\x8d": (_text, 8),  # BINUNICODE8
}
"""The opcodes whose operand is a length (`width` bytes, little-endian) and then that many bytes:
what reads the value from them, and the width."""


def _sized(read: Callable[[_Reader, int], None], width: int) -> Callable[[_Reader], None]:
    """The handler of a length-prefixed opcode: `read` with its length's width."""
    return lambda reader: read(reader, width)


_HANDLERS: dict[bytes, Any] = {
    b"\x80": _proto,
    b"\x95": _frame,
    b"(": _Reader.mark,
    b"0": _pop,
    b"1": lambda r: r.pop_mark(),
    b"2": lambda r: r.push(r.top()),
    b"N": lambda r: r.push(None),
    b"\x88": lambda r: r.push(True),
    b"\x89": lambda r: r.push(False),
    b"I": _int_line,
    b"L": lambda r: r.push(r.number()),
    b"J": _int4,
    b"K": lambda r: r.push(r.unsigned(1)),
    b"M": lambda r: r.push(r.unsigned(2)),
    **{code: _sized(read, width) for code, (read, width) in _LENGTH_PREFIXED.items()},
    b"F": _float_line,
    b"G": _float8,
    b"V": _unicode_line,
    b"]": lambda r: r.push([]),
    b"l": lambda r: r.push(r.pop_mark()),
    b"a": _append,
    b"e": _extend,
    b")": lambda r: r.push(()),
    b"t": lambda r: r.push(tuple(r.pop_mark())),
    b"\x85": lambda r: _tuple(r, 1),
    b"\x86": lambda r: _tuple(r, 2),
    b"\x87": lambda r: _tuple(r, 3),
    b"}": lambda r: r.push({}),
    b"d": _dict_from_mark,
    b"s": _set_item,
    b"u": _set_items,
    b"\x8f": lambda r: r.push(set()),
    b"\x90": _add_items,
    b"\x91": _frozenset,
    b"p": lambda r: r.put(r.number()),
    b"q": lambda r: r.put(r.unsigned(1)),
    b"r": lambda r: r.put(r.unsigned(4)),
    b"\x94": lambda r: r.put(len(r.memo)),
    b"g": lambda r: r.get(r.number()),
    b"h": lambda r: r.get(r.unsigned(1)),
    b"j": lambda r: r.get(r.unsigned(4)),
}
"""The opcodes of plain data, by their byte (Lib/pickletools.py lists them all)."""


def check_plain(value: Any, max_objects: int, max_depth: int) -> None:
    """RefusedPickle unless `value` is plain containers and scalars, within the bounds."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen = 0
    while stack:
        item, level = stack.pop()
        seen += 1
        if seen > max_objects:
            raise RefusedPickle(f"more than {max_objects:,} values")
        if isinstance(item, PLAIN_SCALARS):
            continue
        if level >= max_depth:
            raise RefusedPickle(f"nested deeper than {max_depth} levels")
        if type(item) is dict:
            for key, child in item.items():
                if not isinstance(key, PLAIN_SCALARS):
                    raise RefusedPickle("a dict key is not a plain scalar")
                stack.append((child, level + 1))
        elif type(item) in (list, tuple, set, frozenset):
            stack.extend((child, level + 1) for child in item)
        else:  # unreachable from the reader; kept so the bound holds for JSON alike
            raise RefusedPickle(f"holds a {type(item).__name__}, not plain data")
