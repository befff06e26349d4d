"""`rec.iterate(loader)`: each fetch a `data` span of the step it feeds, which begins there; and
the batch readers of the framework callbacks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import torch
from collector_helpers import _clean_env, of_kind, read_records  # noqa: F401 - autouse fixture

from collectors import NullRecorder, Recorder
from collectors.framework import batch_tokens, output_loss


def slow_batches(count: int, sleep_s: float) -> Iterator[torch.Tensor]:
    for i in range(count):
        time.sleep(sleep_s)  # a slow loader
        yield torch.full((2, 3), float(i))


def test_a_fetch_is_the_data_span_its_step_begins_with(tmp_path: Path) -> None:
    rec = Recorder.from_env(tmp_path)
    assert isinstance(rec, Recorder)
    seen = []
    for batch in rec.iterate(slow_batches(3, 0.02)):
        with rec.step(tokens=batch.numel()), rec.span("fwd"):
            seen.append(float(batch[0, 0]))
    rec.close()
    assert seen == [0.0, 1.0, 2.0]  # every batch, in order, then the loop ends
    records = read_records(tmp_path)
    for step in range(3):
        (data,) = of_kind(records, "span", step=step, phase="data")
        (fwd,) = of_kind(records, "span", step=step, phase="fwd")
        (record,) = of_kind(records, "step", step=step)
        assert data["t1"] - data["t0"] >= 0.02e9  # the fetch's sleep
        assert record["t0"] == data["t0"] <= data["t1"] <= fwd["t0"] <= record["t1"]


def test_off_the_loader_is_passed_through() -> None:
    assert list(NullRecorder().iterate([1, 2, 3])) == [1, 2, 3]


def test_batch_tokens_and_loss() -> None:
    ids = torch.zeros(4, 16, dtype=torch.long)
    assert batch_tokens({"input_ids": ids, "labels": ids}) == 64
    assert batch_tokens((torch.randn(8, 3), torch.randn(8, 1))) == 8  # samples, no token ids
    assert batch_tokens([torch.randn(8, 3), ids]) == 64
    assert batch_tokens(object()) is None and batch_tokens({"x": "text"}) is None
    loss = torch.tensor(1.5)
    assert output_loss({"loss": loss}) is loss and output_loss(loss) is loss
    assert output_loss(None) is None
