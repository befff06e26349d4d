"""The trace reader's shortcuts give what the plain way gives (issue 43's speed work):
- the layout's families tallied once per distinct packed collective (`LayoutView.rows`, with
  its count) equal the families tallied record by record;
- kernels classified once per distinct (name, category) equal each one classified alone;
- the device time's launch starts (`dict` of the last CPU event per correlation id, before
  the last step) equal assigning each CPU event in turn;
- `intervals.difference` (its loop over Python numbers) covers what a covers and b does not.
Random inputs (hypothesis), with repeats, ties and odd values where the readers meet them."""

from __future__ import annotations

import math
from array import array
from collections import Counter
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.numeric import intervals
from diag.read.kineto.device import HTA_PATTERNS, _launch_starts
from diag.read.kineto.kernels import KernelClass, KernelPatterns
from diag.read.kineto.layout import _families
from diag.read.kineto.packed_comms import LayoutView

WORLD = 8
GROUPS = [(0, 1), (2, 3), (0, 2, 4, 6), (1, 3, 5, 7), (0, 4), (0, 1, 2, 3), (3, 9), None]
OPS = ["all_reduce", "all_gather", "send", "recv", "all_to_all", "reduce_scatter", None, ""]

layout_keys = st.tuples(
    st.sampled_from(GROUPS),
    st.sampled_from(["dp", "tp", "", None, "pg3"]),
    st.sampled_from(OPS),
    st.integers(0, WORLD - 1),  # rank
    st.integers(0, 3),  # step
    st.integers(0, 400),  # t0 as the inference reads it
    st.booleans(),  # from_name
    st.one_of(st.none(), st.integers(0, WORLD)),  # peer
    st.one_of(st.none(), st.integers(0, 2**20)),  # bytes
    st.one_of(st.none(), st.booleans()),  # blocking
    st.one_of(st.none(), st.booleans()),  # alone (a message of a group of two)
    st.one_of(st.none(), st.booleans()),  # ahead (an all-gather before the reductions)
)


def _expanded(view: LayoutView) -> list[dict[str, Any]]:
    """The view's collectives as a plain list, each repeated as often as it occurred."""
    return list(view)


def _state(families: dict[tuple[int, ...], Any]) -> list[tuple[Any, ...]]:
    return [
        (shape, sorted(f.groups), sorted(f.names), list(f.ops.items()),
         list(f.per_step.items()), f.early, f.collectives,
         sorted((r, sorted(p)) for r, p in f.sent_to.items()),
         sorted((r, sorted(p)) for r, p in f.received_from.items()),
         sorted(f.lone_p2p.items()))
        for shape, f in families.items()
    ]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(
        st.lists(st.tuples(layout_keys, st.integers(1, 5)), max_size=25), min_size=1, max_size=3
    ),
    windows=st.lists(st.tuples(st.integers(0, WORLD - 1), st.integers(0, 3),
                               st.integers(0, 200), st.integers(0, 500)), max_size=12),
)  # fmt: skip
def test_families_from_counted_rows_equal_families_from_each_record(
    parts: list[list[tuple[tuple[Any, ...], int]]], windows: list[tuple[int, int, int, int]]
) -> None:
    view = LayoutView([Counter(dict(part)) for part in parts])
    steps = [{"rank": r, "step": s, "t0": a, "t1": b} for r, s, a, b in windows]
    configs = [((0, 1), "dp"), ((4, 5, 6, 7), "")]
    assert _state(_families(WORLD, configs, view, steps)) == _state(  # type: ignore[arg-type]
        _families(WORLD, configs, _expanded(view), steps)
    )


NAMES = ["ncclKernel_AllReduce", "Memcpy DtoH", "Memset", "gemm", "hipLaunch", "cudaSync",
         "dma_copy", "ncclDevKernel_SendRecv", "elementwise", ""]  # fmt: skip
CATEGORIES = ["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime"]


@settings(max_examples=60, deadline=None)
@given(
    kernels=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(CATEGORIES)), max_size=40),
    hta=st.booleans(),
)
def test_classifying_each_distinct_kernel_once_equals_classifying_each_kernel(
    kernels: list[tuple[str, str]], hta: bool
) -> None:
    patterns = HTA_PATTERNS if hta else KernelPatterns()
    names = [n for n, _ in kernels]
    categories = [c for _, c in kernels]
    alone = [patterns.classify([n], [c])[0] for n, c in kernels]
    together = patterns.classify(names, categories).tolist()
    assert together == alone
    assert set(together) <= {k.value for k in KernelClass}


correlations = st.one_of(st.integers(-2, 6), st.sampled_from([-1.0, 2.0, math.nan, math.inf, 3.5]))


@settings(max_examples=80, deadline=None)
@given(
    events=st.lists(st.tuples(st.floats(-5, 50, allow_nan=False), correlations), max_size=30),
    steps=st.lists(st.floats(0, 50, allow_nan=False), max_size=3),
    whole_us=st.booleans(),
)
def test_launch_starts_equal_assigning_each_cpu_event_in_turn(
    events: list[tuple[float, Any]], steps: list[float], whole_us: bool
) -> None:
    starts = array("d", [t for t, _ in events])
    ids = [c for _, c in events]
    step_starts = {f"ProfilerStep#{i}": s for i, s in enumerate(steps)}
    expected: dict[Any, float] = {}
    last = max(steps) if len(steps) >= 2 else math.inf
    for start, correlation in zip(starts, ids, strict=True):
        start = start if whole_us else math.ceil(start)
        bound = last if whole_us or math.isinf(last) else math.ceil(last)
        if start < bound and correlation != -1:
            expected[correlation] = float(start)
    # in order, each key the same object (a NaN id is a key of its own, as in the loop)
    assert list(_launch_starts(starts, ids, step_starts, whole_us).items()) == list(
        expected.items()
    )


spans = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=8)


@settings(max_examples=100, deadline=None)
@given(a=spans, b=spans)
def test_difference_covers_what_a_covers_and_b_does_not(
    a: list[tuple[int, int]], b: list[tuple[int, int]]
) -> None:
    def cells(rows: Any) -> set[int]:
        return {t for start, end in rows for t in range(int(start), int(end))}

    found = intervals.difference(np.array(a, dtype=np.int64).reshape(-1, 2),
                                 np.array(b, dtype=np.int64).reshape(-1, 2))  # fmt: skip
    assert cells(found.tolist()) == cells(a) - cells(b)
    assert found.dtype == np.int64
    assert all(s < e for s, e in found.tolist())
    assert found[:, 0].tolist() == sorted(found[:, 0].tolist())


def test_the_schedules_reader_passes_over_the_views_rows_without_holding_them() -> None:
    """`read_schedule` reads the rows twice; it made a list of them (every distinct collective
    of the folder as a dict at once: 1.4 GiB for a moment on 64 ranks x 7,000 steps). The
    view's rows are made again for each pass, and read the same."""
    import tracemalloc

    from diag.read.kineto.schedule import read_schedule

    groups = [[0, 1, 2, 3]]  # one pipeline of four stages
    keys: Counter[tuple[Any, ...]] = Counter()
    for step in range(2_000):
        for rank in range(4):
            for op, peer in (
                ("send", rank + 1),
                ("recv", rank - 1),
                ("send", rank - 1),
                ("recv", rank + 1),
            ):  # activations forward, gradients back
                if 0 <= peer < 4:
                    keys[((0, 1, 2, 3), None, op, rank, step, step * 10, False, peer, 4096,
                          True, True, None)] += 8  # fmt: skip
    view = LayoutView([keys])
    assert list(view.rows) == list(view.rows)  # again, the same
    steps = [{"rank": r, "step": s} for r in range(4) for s in range(2_000)]

    def peak_of(rows: Any) -> tuple[Any, int]:
        tracemalloc.start()
        try:
            return read_schedule(rows, steps, groups), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    held, held_peak = peak_of(iter(view.rows))  # a one-pass iterator: held, as it must be
    got, peak = peak_of(view.rows)
    assert got == held and got.microbatches == 8
    assert peak < held_peak / 2
