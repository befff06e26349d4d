"""Unit tests of the runtime collectors with real torch objects, in one process, without a
process group: the Recorder's files, per-step flushing, the six memory categories measured
exactly, the leak fault, NullRecorder, errors inside collectors, OOM capture. (The collective
tracer and the DDP hook are in test_tracer.py.)
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from collector_helpers import (  # noqa: F401 - _clean_env is an autouse fixture
    SIX,
    MiB,
    _clean_env,
    of_kind,
    open_recorder,
    read_manifest,
    read_records,
    small_model,
    tensor_bytes,
    train_step,
    wait_until,
)
from torch import nn

import collectors.memory
import collectors.safety
from collectors import NullRecorder, Recorder
from collectors.comm import CollectiveTracer
from reference_runs.faults import Leak

# ---------------------------------------------------------------- files and records


def test_recorder_without_process_group_writes_manifest_and_rank_file(tmp_path: Path) -> None:
    model, opt = small_model()
    rec = open_recorder(tmp_path, model, opt)

    manifest = read_manifest(tmp_path)
    assert manifest["schema"] == "diag.run/1"
    assert manifest["status"] == "running"
    assert manifest["world_size"] == 1 and manifest["trainer"] == "custom"
    assert manifest["backend"] is None and manifest["device_type"] == "cpu"
    assert manifest["run_id"] == tmp_path.name

    for _ in range(3):
        train_step(rec, model, opt)
    rec.close()

    manifest = read_manifest(tmp_path)
    assert manifest["status"] == "complete" and manifest["steps_completed"] == 3

    records = read_records(tmp_path)
    assert records[0]["kind"] == "meta"
    assert records[0]["rank"] == 0 and records[0]["world_size"] == 1
    assert {r["kind"] for r in records} == {"meta", "span", "step", "mem", "event"}
    assert [r["name"] for r in of_kind(records, "event")] == ["rank_closed"]  # close() says so

    steps = of_kind(records, "step")
    assert [s["step"] for s in steps] == [0, 1, 2]
    for s in steps:
        assert isinstance(s["t0"], int) and s["t0"] < s["t1"]
        assert s["tokens"] == 4 and isinstance(s["loss"], float)
        spans = of_kind(records, "span", step=s["step"])
        assert [sp["phase"] for sp in spans] == ["data", "fwd", "bwd", "opt"]
        for sp in spans:
            assert s["t0"] <= sp["t0"] <= sp["t1"] <= s["t1"]
        assert len(of_kind(records, "mem", step=s["step"])) == 1
    # consecutive steps do not overlap
    assert all(a["t1"] <= b["t0"] for a, b in itertools.pairwise(steps))


def test_records_of_a_step_are_flushed_when_it_ends(tmp_path: Path) -> None:
    model, opt = small_model()
    rec = open_recorder(tmp_path, model, opt)
    train_step(rec, model, opt)
    train_step(rec, model, opt)
    # not closed: what a SIGKILL would leave behind
    records = read_records(tmp_path)
    assert [s["step"] for s in of_kind(records, "step")] == [0, 1]
    assert len(of_kind(records, "mem", step=1)) == 1
    assert read_manifest(tmp_path)["status"] == "running"
    rec.close("failed")
    assert read_manifest(tmp_path)["status"] == "failed"


def test_recorder_as_context_manager_marks_failure(tmp_path: Path) -> None:
    model, opt = small_model()
    with pytest.raises(RuntimeError, match="boom"), open_recorder(tmp_path, model, opt) as rec:
        train_step(rec, model, opt)
        raise RuntimeError("boom")
    manifest = read_manifest(tmp_path)
    assert manifest["status"] == "failed" and manifest["steps_completed"] == 1


# ---------------------------------------------------------------- memory categories


def test_memory_categories_are_measured_exactly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(16, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = open_recorder(tmp_path, model, opt)
    rec.set_comm_buffer("staging", 1000)
    rec.set_comm_buffer("staging", 3000)  # an update replaces the old size
    rec.set_comm_buffer("other", 24)

    x = torch.randn(4, 16)  # does not require grad: only it is saved (the weight is excluded)
    with rec.step(tokens=4) as step:
        with rec.span("fwd"):
            loss = model(x).sum()
        with rec.span("bwd"):
            loss.backward()
        with rec.span("opt"):
            opt.step()
            opt.zero_grad(set_to_none=True)  # inside the span: grads were taken at its start
        step.loss = loss.item()
    rec.close()

    assert all(p.grad is None for p in model.parameters())
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    state_tensors = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    assert {k for s in opt.state.values() for k in s} == {"step", "exp_avg", "exp_avg_sq"}
    optimizer_bytes = tensor_bytes(state_tensors)
    assert optimizer_bytes == 2 * param_bytes + 4 * len(list(model.parameters()))

    (mem,) = of_kind(read_records(tmp_path), "mem")
    assert mem["params"] == param_bytes == (16 * 8 + 8) * 4
    assert mem["grads"] == param_bytes
    assert mem["optimizer"] == optimizer_bytes
    assert mem["activations"] == x.numel() * 4
    assert mem["comm_buffers"] == 3024
    assert mem["fragmentation"] is None and mem["device_peak"] is None
    assert mem["host_rss"] > 0 and mem["source"] == "tensors"


def test_tied_and_aliased_tensors_count_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(10, 8)
    head = nn.Linear(8, 10, bias=False)
    head.weight = emb.weight  # tied, as in the GPT
    model = nn.ModuleDict({"emb": emb, "head": head})
    rec = open_recorder(tmp_path, model, None)
    x = torch.randn(3, 8, requires_grad=True)
    with rec.step(), rec.span("fwd"):
        y = x * 2  # a product with a constant saves nothing
        # two views of y saved: its storage is counted once
        z = y.view(-1).square().sum() + y.view(2, 12).square().sum()
        ids = torch.tensor([1, 2])
        out = head(emb(ids))  # the tied weight is a parameter: excluded
    rec.close()
    (mem,) = of_kind(read_records(tmp_path), "mem")
    assert mem["params"] == 10 * 8 * 4
    assert mem["optimizer"] is None and mem["grads"] == 0
    # y (96 bytes), the embedding's indices (2 int64) and its output saved by the head's matmul
    assert mem["activations"] == y.numel() * 4 + ids.numel() * 8 + out.shape[0] * 8 * 4
    assert z.requires_grad


def test_leak_grows_activations_by_exactly_its_size_per_step(tmp_path: Path) -> None:
    model, opt = small_model()
    rec = open_recorder(tmp_path, model, opt, activation_every=1)
    leak = Leak(4 * MiB)
    for _ in range(4):
        train_step(rec, model, opt, leak=leak)
    rec.close()
    activations = [m["activations"] for m in of_kind(read_records(tmp_path), "mem")]
    assert len(activations) == 4
    assert [b - a for a, b in itertools.pairwise(activations)] == [4 * MiB] * 3
    assert leak.retained_bytes == 16 * MiB


def test_activations_are_sampled_on_the_first_steps_then_every_nth(tmp_path: Path) -> None:
    model, opt = small_model()
    rec = open_recorder(tmp_path, model, opt, activation_every=4)
    for _ in range(9):
        train_step(rec, model, opt)
    rec.close()
    measured = [m["step"] for m in of_kind(read_records(tmp_path), "mem") if m["activations"]]
    assert measured == [0, 1, 2, 4, 8]


def test_without_activation_tracking_activations_are_null(tmp_path: Path) -> None:
    model, opt = small_model()
    rec = open_recorder(tmp_path, model, opt, track_activations=False)
    train_step(rec, model, opt)
    rec.close()
    (mem,) = of_kind(read_records(tmp_path), "mem")
    assert mem["activations"] is None and mem["params"] > 0


# ---------------------------------------------------------------- switched off


@pytest.mark.parametrize("how", ["enabled=False", "DIAG_COLLECTORS=0"])
def test_null_recorder_writes_nothing_and_its_contexts_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    run_dir = tmp_path / "run"
    model, opt = small_model()
    if how == "enabled=False":
        rec = Recorder.from_env(run_dir, model=model, optimizer=opt, enabled=False)
    else:
        monkeypatch.setenv("DIAG_COLLECTORS", "0")
        rec = Recorder.from_env(run_dir, model=model, optimizer=opt, trace_collectives=True)
    assert isinstance(rec, NullRecorder) and not rec.enabled

    for _ in range(2):
        train_step(rec, model, opt)
    with rec.collective("all_reduce", 100, None, tag="x"), rec.tagged("t", expected_bytes=1):
        pass
    rec.register_group("dp", None)
    rec.set_comm_buffer("b", 10)
    rec.event("anything", x=1)
    rec.experts(0, [1, 2])
    rec.flush()
    rec.close()
    with rec:
        pass
    assert not run_dir.exists()
    assert CollectiveTracer._installed is None


# ---------------------------------------------------------------- errors never stop training


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "collectors" and r.levelno == logging.WARNING
    ]


class _BrokenParameters(nn.Module):
    """A model whose `parameters()` raises once training has started (forward still works)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8)
        self.broken = False

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        if self.broken:
            raise RuntimeError("parameters() is broken")
        return super().parameters(recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(x)
        return out


def _train_with_fault(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: str, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = _BrokenParameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = open_recorder(tmp_path, model, opt)
    caplog.set_level(logging.WARNING, logger="collectors")
    if fault == "parameters":
        model.broken = True
    elif fault == "host_rss":

        def broken_rss() -> int:
            raise OSError("no /proc here")

        monkeypatch.setattr(collectors.memory, "host_rss_bytes", broken_rss)
    weights = model.lin.weight.detach().clone()
    reported_after_first_step: list[str] = []
    for step in range(4):
        if fault == "parameters":
            rec.watch(model, opt)  # a user re-pointing the recorder at a broken model
        if fault == "comm_buffer":
            rec.set_comm_buffer("bucket", "garbage")  # type: ignore[arg-type]
            rec.set_comm_buffer("other", None)  # type: ignore[arg-type]
        train_step(rec, model, opt)
        if step == 0:
            reported_after_first_step = _warnings(caplog)
    rec.close()
    assert not torch.equal(weights, model.lin.weight)  # training really went on
    reported = _warnings(caplog)
    assert reported, "the error was not reported"
    assert reported == reported_after_first_step, "later steps reported the same error again"
    assert len(reported) == len(set(reported)), f"reported more than once: {reported}"
    records = read_records(tmp_path)
    assert [s["step"] for s in of_kind(records, "step")] == [0, 1, 2, 3]
    manifest = read_manifest(tmp_path)
    assert manifest["status"] == "complete" and manifest["steps_completed"] == 4
    return records


def test_broken_model_parameters_do_not_stop_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _train_with_fault(tmp_path, caplog, "parameters", monkeypatch)
    # each step keeps its spans and its memory (measured from the last good parameter list)
    for step in range(4):
        assert len(of_kind(records, "span", step=step)) == 4


def test_garbage_comm_buffer_does_not_stop_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _train_with_fault(tmp_path, caplog, "comm_buffer", monkeypatch)
    assert len(_warnings(caplog)) == 1
    assert [m["comm_buffers"] for m in of_kind(records, "mem")] == [0] * 4


def test_failing_memory_probe_does_not_stop_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _train_with_fault(tmp_path, caplog, "host_rss", monkeypatch)
    assert len(_warnings(caplog)) == 1


def test_unknown_span_phase_is_reported_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rec = open_recorder(tmp_path, None, None)
    caplog.set_level(logging.WARNING, logger="collectors")
    with rec.step():
        for _ in range(3):
            with rec.span("lunch"):
                pass
    rec.close()
    assert len(_warnings(caplog)) == 1
    assert len(of_kind(read_records(tmp_path), "step")) == 1


# ---------------------------------------------------------------- OOM


def test_oom_inside_a_step_is_reraised_and_recorded(tmp_path: Path) -> None:
    model, opt = small_model()
    rec = open_recorder(tmp_path, model, opt)
    train_step(rec, model, opt)
    message = "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 1 GiB total)"
    with (
        pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"),
        rec.step(tokens=4),
        rec.span("fwd"),
    ):
        model(torch.randn(4, 16)).sum()
        raise torch.OutOfMemoryError(message + "\nsecond line of advice")
    # flushed immediately, before anyone closes the recorder
    records = read_records(tmp_path)
    (oom,) = of_kind(records, "event", name="oom")
    assert oom["step"] == 1
    assert oom["message"] == message
    for category in SIX:
        assert category in oom
    assert oom["params"] == sum(p.numel() * 4 for p in model.parameters())
    assert oom["optimizer"] > 0 and oom["activations"] > 0 and oom["fragmentation"] is None
    assert [s["step"] for s in of_kind(records, "step")] == [0]  # the OOM step did not finish
    rec.close("failed")
    assert read_manifest(tmp_path)["steps_completed"] == 1
