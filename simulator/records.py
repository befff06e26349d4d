"""Records of the simulated run as the engine emits them: one JSON head per kind of record,
repeated over a batch of ranks with their own times (the writer appends the varying fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

DTYPE_NAMES = {1: "float8_e4m3fn", 2: "bfloat16", 4: "float32", 8: "float64"}

_encode = msgspec.json.Encoder().encode


def head(fields: dict[str, Any]) -> bytes:
    """A record's JSON without its closing brace (times and varying fields are appended)."""
    return _encode(fields)[:-1]


@dataclass(frozen=True)
class Batch:
    """One record on each of `ranks`: the fields of `head`, then `vary` (a field whose integer
    value differs per rank), then `t0` and `t1` (ns from the run's start) when timed."""

    head: bytes
    ranks: np.ndarray  # (n,) or any shape: flattened in C order with the arrays below
    t0: np.ndarray | None = None
    t1: np.ndarray | None = None
    vary: tuple[str, np.ndarray] | None = None
