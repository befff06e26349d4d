"""What the scanner keeps across one trace's batches (`ScanMemo`, scanned.py, issue 43): each
string's flags, and the argument sets kept for their text, with the keys' spans and bounds.

A `record_param_comms` scope or an `nccl:` annotation repeats a few argument texts every step
(55% of a simulated communication-heavy rank's events): an argument text seen before, whose
set SharedArgs already keeps, is that set, not decoded again (so nothing is shared that
SharedArgs would not share). A collective kernel's own set (newer Kineto copies the
collective's arguments onto it) differs from its step's others only in its ids, `correlation`
and `External id`: its text without their values (`ids_cut_spans`) seen before is the set
kept for it with this kernel's correlation (`External id` is not read), its values already
shared. The keys are cut from the batch's text in C (`event_scan.cut_texts`, from the spans
given here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from diag.read.kineto.events import Args

MAX_TEXTS = 16_384
"""Argument texts a trace's `ScanMemo` keeps, each kind (more: decoded each time)."""
MAX_TEXT_BYTES = 1_024
"""The longest argument text kept as a key (so the texts hold at most 16 MiB)."""


@dataclass
class ScanMemo:
    """(The module's docstring says what and why.)"""

    flags: dict[str, int] = field(default_factory=dict)
    texts: dict[bytes, Args] = field(default_factory=dict)  # a scope's, an annotation's
    kernel_texts: dict[bytes, Args] = field(default_factory=dict)  # without ids


def whole_spans(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """`cut_texts` spans (start, two empty cuts, end) of the texts from `starts` to `ends`."""
    start, end = starts[:, None], ends[:, None]
    return np.hstack([start, start, start, end, end, end])


def ids_cut_spans(
    starts: np.ndarray, ends: np.ndarray, correlation: np.ndarray, external: np.ndarray
) -> np.ndarray:
    """`cut_texts` spans of argument texts (from `starts` to `ends`) without the values of
    their `correlation` (each has one) and `External id` (where it has one; (0, 0) where
    not): (start, value) rows as the scanner gives them. The keys stay, so that texts alike
    but for those values are equal and no others are."""
    external = external.copy()
    none = external[:, 0] == 0  # none: an empty cut just after the correlation's
    external[none] = correlation[none][:, [1, 1]]
    external_first = (external[:, 0] < correlation[:, 0])[:, None]
    return np.column_stack([
        starts, np.where(external_first, external, correlation),
        np.where(external_first, correlation, external), ends,
    ])  # fmt: skip


def kept_by_text(
    found: Args, decoded: Args | None, text: bytes | None, texts: dict[bytes, Args]
) -> Args:
    """`found` (SharedArgs' set for `decoded`), kept for `text` where SharedArgs keeps it
    (it is not `decoded` itself: an equal set was kept before; a kernel's, `decoded` None:
    its values are), within MAX_TEXTS."""
    if text is not None and found is not decoded and len(texts) < MAX_TEXTS:
        texts[text] = found
    return found
