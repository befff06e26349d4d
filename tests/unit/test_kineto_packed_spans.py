"""A trace's spans cross from the parsing worker as packed columns (issue 43: the gathering
process held one dict a span); the table is the one the plain columns give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import diag.read.kineto as kineto
import diag.read.kineto.packed_comms as packed_comms
from diag.read.kineto import load_trace_dir
from tests.unit.simulated_jobs import trace_folder


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trace_folder(tmp_path_factory, "packed", steps=2)


def test_packed_spans_give_the_plain_columns_table(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = load_trace_dir(traces, use_cache=False, workers=1)
    files = kineto.trace_files(traces)
    (first, spans, comms), *_ = kineto._parse_all(files, kineto.KernelPatterns(), 1)
    assert first.records["span"] == [] and isinstance(spans["t0"], np.ndarray)
    assert first.records["comm"] == [] and isinstance(comms.columns["t0"], np.ndarray)

    def refuse(*_: Any, **__: Any) -> Any:
        raise TypeError("a column that will not pack")

    monkeypatch.setattr(kineto, "pack", refuse)  # every trace falls back to plain columns
    monkeypatch.setattr(packed_comms, "pack", refuse)
    plain = load_trace_dir(traces, use_cache=False, workers=1)
    assert len(packed.spans) > 50
    pd.testing.assert_frame_equal(packed.spans, plain.spans)
    pd.testing.assert_frame_equal(packed.comms, plain.comms)


def test_the_layout_counts_the_packed_collectives_as_it_counted_the_dicts(traces: Path) -> None:
    from diag.read.kineto.files import parse_file
    from diag.read.kineto.layout import infer_layout
    from diag.read.kineto.packed_comms import LayoutView, pack_comms

    parsed = [parse_file(path, kineto.KernelPatterns()) for path in kineto.trace_files(traces)]
    comms = [comm for trace in parsed for comm in trace.records["comm"]]
    steps = [step for trace in parsed for step in trace.records["step"]]
    configs = [group for trace in parsed for group in trace.pg_groups]
    assert any(comm.get("group_ranks") for comm in comms) and len(comms) > 50
    view = LayoutView([pack_comms(t.records["comm"], t.records["step"]).layout_rows
                       for t in parsed])  # fmt: skip
    distinct = sum(len(part) for part in view.parts)
    assert distinct < len(comms) and sum(1 for _ in view) <= len(comms)
    from_dicts = infer_layout(len(parsed), configs, comms, steps)
    from_view = infer_layout(len(parsed), configs, list(view), steps)
    assert infer_layout(len(parsed), configs, view, steps) == from_view  # read as it iterates
    assert from_view == from_dicts and from_dicts.layout.pp == 2


def test_the_layout_rows_as_columns_give_back_every_key_and_count() -> None:
    from collections import Counter

    from diag.read.kineto.packed_comms import LayoutRows

    counted = Counter({
        ((0, 1), "pp", "send", 0, 3, 10, False, 1, 4096): 5,
        (None, None, "all_reduce", 0, 3, 20, True, None, 2.5): 1,
        ((0, 2), "dp", "all_reduce", 0, 2**62, -7, False, None, None): 2,
    })  # fmt: skip
    rows = LayoutRows.of(counted)
    assert len(rows) == 3 and dict(rows.items()) == counted
    for (key, _), (theirs, _) in zip(rows.items(), counted.items(), strict=True):
        assert [type(v) for v in key] == [type(v) for v in theirs]
    assert dict(LayoutRows.of(Counter()).items()) == {}


def test_a_layout_key_is_read_as_the_dict_of_its_fields() -> None:
    from collections import Counter

    from diag.read.kineto.packed_comms import LAYOUT_FIELDS, LayoutRows, LayoutView

    key = ((0, 1), "pp", "send", 0, 3, 10, False, 1, 4096, True, None, False)
    view = LayoutView([LayoutRows.of(Counter({key: 2}))])
    rows = list(view.rows)
    assert rows == [(dict(zip(LAYOUT_FIELDS, key, strict=True)), 2)]
    assert list(rows[0][0]) == list(LAYOUT_FIELDS)  # in their order
    assert list(view) == [rows[0][0]] * 2
