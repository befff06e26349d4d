"""Load a pickle that may only hold plain data: an unpickler that resolves no global at all.

Loading a pickle runs whatever callable it names (`os.system` through `__reduce__`): every way
a pickle names a callable (GLOBAL, STACK_GLOBAL, INST, OBJ, the extension registry's EXT codes)
goes through `find_class`, and a persistent id through `persistent_load`; here both refuse, so
what loads is built from the pickle's own containers and scalars only (dict, list, tuple, set,
str, bytes, int, float, bool, None) and nothing is called. Bounded in bytes before loading and
walked without recursion after it, counting every value reached (a shared list counts each
time: a few bytes of pickle can reference one list 2**60 times).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

PLAIN_SCALARS = (str, bytes, int, float, bool, type(None))


class RefusedPickle(ValueError):
    """The pickle names a callable or a persistent object, is too large, too deep, or not plain."""


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickle(f"names a global ({module[:80]}.{name[:80]}): refused, nothing run")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("holds a persistent id: refused")


def load_plain(data: bytes, max_bytes: int, max_objects: int, max_depth: int) -> Any:
    """The plain value pickled in `data`; RefusedPickle (the reason) on anything else."""
    if len(data) > max_bytes:
        raise RefusedPickle(f"{len(data):,} bytes, above the limit of {max_bytes:,}")
    try:
        value = _NoGlobals(io.BytesIO(data)).load()
    except RefusedPickle:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
            KeyError, AttributeError, MemoryError, RecursionError) as err:  # fmt: skip
        raise RefusedPickle(f"not a readable pickle ({type(err).__name__})") from None
    check_plain(value, max_objects, max_depth)
    return value


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
        else:  # unreachable without a global; kept so the bound holds whatever the loader makes
            raise RefusedPickle(f"holds a {type(item).__name__}, not plain data")
