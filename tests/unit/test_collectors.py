"""Unit tests of the runtime collectors with real torch objects, in one process.

Without a process group: the Recorder's files, per-step flushing, the six memory categories
measured exactly, the leak fault, NullRecorder, errors inside collectors, OOM capture. In a
1-rank gloo world: the collective tracer (payload sizes, async work, tags, groups, uninstall,
hand-recorded collectives) and the recording DDP hook.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import collectors.memory
import collectors.safety
from collectors import NullRecorder, Recorder, register_recording_hook
from collectors.comm import CollectiveTracer
from reference_runs.faults import Leak

torch.set_num_threads(1)

SIX = ("params", "grads", "optimizer", "activations", "comm_buffers", "fragmentation")
MiB = 2**20


# ---------------------------------------------------------------- helpers and fixtures


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No torchrun variables, collectors on, and a fresh 'reported once' memory per test."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DIAG_COLLECTORS", "DIAG_COMMAND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(collectors.safety, "_reported", set())
    yield
    leftover = CollectiveTracer._installed
    if leftover is not None:
        leftover.uninstall()  # so that one failure does not cascade into the next tests
    assert leftover is None, "a test left the collective tracer installed"


def read_records(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    path = run_dir / f"rank-{rank:05d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def of_kind(records: list[dict[str, Any]], kind: str, **match: Any) -> list[dict[str, Any]]:
    return [
        r for r in records if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())
    ]


def read_manifest(run_dir: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((run_dir / "manifest.json").read_text())
    return manifest


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def small_model(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(
    rec: Any, model: nn.Module, opt: torch.optim.Optimizer, leak: Leak | None = None
) -> torch.Tensor:
    """One step in the shape of reference_runs/dp.py; returns the input (kept alive by caller)."""
    with rec.step(tokens=4) as step:
        with rec.span("data"):
            x = torch.randn(4, 16)
        with rec.span("fwd"):
            loss = model(x).sum()
            if leak is not None:
                leak.step()
        with rec.span("bwd"):
            loss.backward()
        with rec.span("opt"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        step.loss = loss.item()
    return x


def open_recorder(run_dir: Path, model: nn.Module | None, opt: Any, **kw: Any) -> Recorder:
    rec = Recorder.from_env(run_dir, model=model, optimizer=opt, **kw)
    assert isinstance(rec, Recorder)
    return rec


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


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
    assert {r["kind"] for r in records} == {"meta", "span", "step", "mem"}

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


# ---------------------------------------------------------------- 1-rank gloo world


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def world() -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


TRACED_NAMES = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_gather_single",
    "reduce_scatter_single",
    "all_to_all_single",
    "broadcast",
    "barrier",
)


def test_collective_tracer_records_every_call_and_uninstalls(world: None, tmp_path: Path) -> None:
    originals = {name: getattr(c10d, name) for name in TRACED_NAMES}
    assert all(getattr(dist, name) is originals[name] for name in TRACED_NAMES)
    rec = open_recorder(tmp_path, None, None, trace_collectives=True)
    assert isinstance(CollectiveTracer._installed, CollectiveTracer)
    assert dist.all_reduce is not originals["all_reduce"]
    assert c10d.all_reduce is dist.all_reduce  # both spellings are patched
    assert getattr(dist.all_reduce, "__wrapped__", None) is originals["all_reduce"]

    t = torch.ones(256)  # 1 KiB
    with rec.step():
        dist.all_reduce(t)
        work = dist.all_reduce(torch.ones(64), async_op=True)
        assert work is not None
        work.wait()
        with warnings.catch_warnings():  # deprecated in newer torch, still public
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_into_tensor(torch.empty(512), torch.ones(512))
            dist.reduce_scatter_tensor(torch.empty(32), torch.ones(32))
        # their successors (FSDP2 calls these); the deprecated spellings above delegate to them
        # and are not counted twice
        dist.all_gather_single(torch.empty(6), torch.ones(6))
        dist.reduce_scatter_single(torch.empty(7), torch.ones(7))
        dist.all_to_all_single(torch.empty(16, dtype=torch.float64), torch.ones(16).double())
        dist.broadcast(torch.ones(8), src=0)
        with rec.tagged("x", expected_bytes=123):
            dist.all_reduce(torch.ones(10))
        rec.register_group("dp", None)
        dist.all_reduce(torch.ones(5))
        # a hand-recorded collective: the traced call inside is not counted twice
        with rec.collective("all_reduce", 400, None, tag="manual", dtype="float32"):
            dist.all_reduce(torch.ones(100))
        # the async record is written when its work completes (possibly on gloo's thread)
        assert wait_until(
            lambda: any(r["kind"] == "comm" and r["async"] for r in rec._writer._pending)
        )
    rec.close()

    for name, original in originals.items():
        assert getattr(dist, name) is original
        assert getattr(c10d, name) is original
    assert CollectiveTracer._installed is None
    assert dist.all_reduce is torch.distributed.distributed_c10d.all_reduce

    records = read_records(tmp_path)
    comms = of_kind(records, "comm")
    summary = [(c["op"], c["bytes"], c["async"], c["blocking"], c["tag"]) for c in comms]
    async_record = next(c for c in comms if c["async"])
    assert async_record["bytes"] == 256 and async_record["blocking"] is False
    sync = [c for c in comms if not c["async"]]
    assert [(c["op"], c["bytes"], c["blocking"], c["tag"]) for c in sync] == [
        ("all_reduce", 1024, True, None),
        ("all_gather", 2048, True, None),  # the gathered output
        ("reduce_scatter", 128, True, None),  # the input
        ("all_gather", 24, True, None),
        ("reduce_scatter", 28, True, None),
        ("all_to_all", 128, True, None),  # the input (float64)
        ("broadcast", 32, True, None),
        ("all_reduce", 40, True, "x"),
        ("all_reduce", 20, True, None),
        ("all_reduce", 400, True, "manual"),
    ], summary
    assert len(comms) == 11
    for c in comms:
        assert c["step"] == 0 and c["group_size"] == 1 and c["t0"] <= c["t1"]
    assert [c["expected_bytes"] for c in sync] == [None] * 7 + [123, None, None]
    assert [c["group"] for c in sync] == ["world"] * 8 + ["dp", "dp"]
    assert [c["dtype"] for c in sync] == ["float32"] * 5 + ["float64"] + ["float32"] * 4

    (wait,) = of_kind(records, "span", phase="comm_wait")
    assert wait["source"] == "work_wait" and wait["t0"] <= wait["t1"]
    assert async_record["t0"] <= wait["t1"]


def test_payload_sizes_follow_the_run_format_in_a_4_rank_world(tmp_path: Path) -> None:
    """In a 1-rank world input and output sizes coincide; torch's fake backend (no data moves)
    gives a 4-rank world where gathered outputs and scattered inputs are 4x the other side."""
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=1, world_size=4)
    try:
        rec = Recorder(tmp_path, rank=1, world_size=4)  # from_env's clock barrier needs data
        rec.trace_collectives()
        with rec.step():
            dist.all_gather_single(torch.empty(16), torch.ones(4))
            dist.all_gather([torch.empty(4) for _ in range(4)], torch.ones(4))
            dist.reduce_scatter_single(torch.empty(4), torch.ones(16))
            dist.all_to_all_single(torch.empty(8), torch.ones(12), [1, 1, 3, 3], [3, 3, 3, 3])
            dist.all_reduce(torch.ones(5), async_op=True).wait()
            dist.barrier()
        rec.close()
    finally:
        dist.destroy_process_group()
    comms = of_kind(read_records(tmp_path, rank=1), "comm")
    assert [(c["op"], c["bytes"], c["group_size"]) for c in comms] == [
        ("all_gather", 64, 4),  # the gathered output
        ("all_gather", 64, 4),  # the sum of the output list
        ("reduce_scatter", 64, 4),  # the input
        ("all_to_all", 48, 4),  # the input: the sum of its splits
        ("all_reduce", 20, 4),  # a future without a value is still recorded
        ("barrier", 0, 4),
    ]


def test_only_one_tracer_per_process(world: None, tmp_path: Path) -> None:
    rec = open_recorder(tmp_path / "a", None, None, trace_collectives=True)
    try:
        with pytest.raises(RuntimeError, match="already installed"):
            open_recorder(tmp_path / "b", None, None, trace_collectives=True)
    finally:
        rec.close()
    # once the first is closed, another one may trace
    rec2 = open_recorder(tmp_path / "c", None, None, trace_collectives=True)
    dist.all_reduce(torch.ones(3))
    rec2.close()
    assert len(of_kind(read_records(tmp_path / "c"), "comm")) == 1


def test_ddp_recording_hook_records_every_gradient_byte(world: None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.Linear(256, 8))
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=0.1)  # several buckets (~0.36 MB of gradients)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    rec = open_recorder(tmp_path, model, opt, trace_collectives=True)
    rec.register_group("dp", None)
    register_recording_hook(rec, ddp)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(3):
        train_step(rec, ddp, opt)
    rec.close()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())

    records = read_records(tmp_path)
    comms = of_kind(records, "comm")
    assert comms and all(c["tag"] == "grad" for c in comms)  # the tracer did not count them again
    for step in range(3):
        grads = of_kind(records, "comm", step=step, tag="grad")
        assert len(grads) == 1 if step == 0 else len(grads) > 1  # rebuilt after step 0
        assert sum(c["bytes"] for c in grads) == param_bytes
        assert sum(c["expected_bytes"] for c in grads) == param_bytes
        for c in grads:
            assert c["op"] == "all_reduce" and c["group"] == "dp" and c["async"] is True
            assert c["group_size"] == 1 and c["t0"] <= c["t1"]
        (step_record,) = of_kind(records, "step", step=step)
        (bwd,) = of_kind(records, "span", step=step, phase="bwd")
        assert all(bwd["t0"] <= c["t0"] and c["t1"] <= bwd["t1"] for c in grads)
        assert step_record["t0"] <= bwd["t0"]
        (mem,) = of_kind(records, "mem", step=step)
        assert mem["comm_buffers"] >= param_bytes
        assert mem["grads"] == param_bytes
    waits = of_kind(records, "span", phase="comm_wait")
    assert all(w["source"] == "ddp_hook" and w["t0"] < w["t1"] for w in waits)
