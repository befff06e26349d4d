"""The hand-written pickle reader (diag/read/safe_pickle.py): plain values pickled by Python in
protocols 2-5 read as `pickle.loads` reads them; random and mutated bytes raise nothing but its
own `RefusedPickle`; every opcode that names or calls something is refused by name; deep
nesting, huge declared lengths, long integers and a flooded memo are refused. The tests write
their pickles with the standard pickler; the reader under test never imports it. Real dumps
torch writes are compared in tests/distributed/test_flight_recorder.py."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.contract.limits import MAX_FR_DEPTH, MAX_FR_OBJECTS
from diag.read.safe_pickle import RefusedPickle, load_plain

LIMIT = 2**22


def _load(data: bytes, **bounds: int) -> Any:
    return load_plain(data, LIMIT, MAX_FR_OBJECTS, MAX_FR_DEPTH, **bounds)


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**300), max_value=2**300),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=40),
)
_keys = st.one_of(
    st.text(max_size=12), st.integers(), st.booleans(), st.none(), st.binary(max_size=8)
)
_plain = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.tuples(inner),
        st.tuples(inner, inner),
        st.tuples(inner, inner, inner),
        st.lists(inner, max_size=6).map(tuple),
        st.dictionaries(_keys, inner, max_size=6),
        st.frozensets(_keys, max_size=4),
        st.sets(_keys, max_size=4),
    ),
    max_leaves=40,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_plain, protocol=st.integers(min_value=4, max_value=5))
def test_plain_values_read_as_pickle_loads_reads_them(value: Any, protocol: int) -> None:
    data = pickle.dumps(value, protocol)
    assert _load(data) == pickle.loads(data)


@settings(max_examples=200, deadline=None)
@given(value=st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
              st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.lists(inner, max_size=5).map(tuple),
                            st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=30,
), protocol=st.integers(min_value=0, max_value=3))  # fmt: skip
def test_the_older_protocols_read_alike_without_bytes_or_sets(value: Any, protocol: int) -> None:
    """Protocols 0-3 pickle bytes and sets through a global (refused); the rest reads alike,
    protocol 2 as torch's C++ pickler writes a dump."""
    data = pickle.dumps(value, protocol)
    assert _load(data) == pickle.loads(data)


def test_shared_and_memoised_values_keep_their_sharing() -> None:
    inner = [1, "s"]
    got = _load(pickle.dumps({"a": inner, "b": inner, "c": (inner, inner)}, 2))
    assert got["a"] is got["b"] is got["c"][0]


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_the_readers_error(data: bytes) -> None:
    for candidate in (data, b"\x80\x04" + data, b"\x80\x02" + data + b"."):
        with contextlib.suppress(RefusedPickle):
            _load(candidate)


_SEEDS = [pickle.dumps({"entries": [{"seq": i, "op": "all_reduce", "sizes": [[8, 2]],
                                     "frames": [{"line": 3, "name": "f"}], "t": 1.5, "b": b"x",
                                     "s": {1, 2}, "big": 2**70, "none": None}
                                    for i in range(3)]}, protocol)
          for protocol in (2, 4, 5)]  # fmt: skip


@settings(max_examples=1500, deadline=None)
@given(seed=st.sampled_from(_SEEDS), edits=st.lists(
    st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), max_size=4),
    cut=st.integers(min_value=0))  # fmt: skip
def test_mutated_dumps_raise_only_the_readers_error(seed: bytes, edits: list, cut: int) -> None:
    data = bytearray(seed)
    for at, byte in edits:
        data[at % len(data)] = byte
    for candidate in (bytes(data), bytes(data[: cut % len(data)])):
        with contextlib.suppress(RefusedPickle):
            _load(candidate)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


class _Builds:
    """Pickled with BUILD (a __setstate__ call) and NEWOBJ."""

    def __init__(self) -> None:
        self.x = 1


@pytest.mark.parametrize("protocol", range(6))
def test_every_opcode_that_names_or_calls_is_refused_by_name(protocol: int, tmp_path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(RefusedPickle, match=r"names a global \((posix|nt)\.system\)"):
        _load(pickle.dumps([_RunsCode(marker)], protocol))
    with pytest.raises(RefusedPickle, match="names a global"):
        _load(pickle.dumps({"a": _Builds()}, protocol))
    assert not marker.exists()


@pytest.mark.parametrize(
    ("opcode", "name"),
    [(b"R", "REDUCE"), (b"b", "BUILD"), (b"o", "OBJ"), (b"\x81", "NEWOBJ"),
     (b"\x92", "NEWOBJ_EX"), (b"\x82\x01", "EXT1"), (b"Q", "BINPERSID"), (b"P1\n", "PERSID"),
     (b"\x97", "NEXT_BUFFER"), (b"\x96" + struct.pack("<Q", 1) + b"x", "BYTEARRAY8")],
)  # fmt: skip
def test_calling_opcodes_are_refused_wherever_they_stand(opcode: bytes, name: str) -> None:
    with pytest.raises(RefusedPickle, match=name):
        _load(b"\x80\x04NN" + opcode + b".")


def test_a_persistent_id_is_refused() -> None:
    out = io.BytesIO()
    pickler = pickle.Pickler(out, 4)
    pickler.persistent_id = lambda obj: "x" if obj == "p" else None  # type: ignore[method-assign]
    pickler.dump(["p"])
    with pytest.raises(RefusedPickle, match="persistent"):
        _load(out.getvalue())


def test_deep_nesting_is_refused_while_reading_and_after() -> None:
    nested: Any = []
    for _ in range(MAX_FR_DEPTH + 4):
        nested = [nested, 1]
    with pytest.raises(RefusedPickle, match="deeper"):  # a MARK per level: refused as it reads
        _load(pickle.dumps(nested, 4))
    one: Any = []
    for _ in range(MAX_FR_DEPTH + 4):
        one = [one]
    with pytest.raises(RefusedPickle, match="deeper"):  # APPEND needs no MARK: the walk after
        _load(pickle.dumps(one, 4))
    marks = b"\x80\x04" + b"(" * 100_000
    with pytest.raises(RefusedPickle, match="deeper"):
        _load(marks)
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(RefusedPickle, match="deeper"):
        _load(pickle.dumps(cyclic, 4))


@pytest.mark.parametrize(
    "data",
    [b"\x80\x04X" + struct.pack("<I", 2**32 - 1) + b"abc.",  # BINUNICODE of 4 GiB
     b"\x80\x04\x8d" + struct.pack("<Q", 2**63) + b"abc.",  # BINUNICODE8
     b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"abc.",  # BINBYTES8
     b"\x80\x04B" + struct.pack("<I", 2**31) + b".",  # BINBYTES
     b"\x80\x04\x95" + struct.pack("<Q", 2**60) + b"N.",  # FRAME
     b"\x80\x02T" + struct.pack("<I", 2**31) + b"."],  # BINSTRING
)  # fmt: skip
def test_huge_declared_lengths_are_refused_not_allocated(data: bytes) -> None:
    with pytest.raises(RefusedPickle, match="more than the pickle holds"):
        _load(data)


def test_long_integers_and_a_flooded_memo_are_refused() -> None:
    with pytest.raises(RefusedPickle, match="integer of"):
        _load(b"\x80\x04\x8b" + struct.pack("<I", 2**20) + b"\x01" * 2**20 + b".")
    with pytest.raises(RefusedPickle, match="integer"):
        _load(b"I" + b"9" * 10_000 + b"\n.")
    flood = b"\x80\x04]" + b"\x94" * 50 + b"."
    with pytest.raises(RefusedPickle, match="memo entries"):
        _load(flood, max_memo=10)
    assert _load(flood, max_memo=50) == []


def test_a_shared_list_walked_exponentially_is_refused() -> None:
    # one list referenced twice at every level (a few hundred bytes, 2**14 values to walk)
    shared: Any = []
    for _ in range(14):
        shared = [shared, shared]
    with pytest.raises(RefusedPickle, match="values"):
        load_plain(pickle.dumps(shared, 4), LIMIT, 1000, 64)
