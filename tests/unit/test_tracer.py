"""The collective tracer (payload sizes, async work, tags, groups, uninstall, hand-recorded
collectives) and the recording DDP hook, in a 1-rank gloo world (and a fake 4-rank one)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from collector_helpers import (  # noqa: F401 - fixtures: _clean_env (autouse), gloo_world (`world`)
    SIX,
    MiB,
    _clean_env,
    gloo_world,
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
from torch.nn.parallel import DistributedDataParallel as DDP

from collectors import Recorder, register_recording_hook
from collectors.comm import CollectiveTracer

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
            lambda: any(r["kind"] == "comm" and r["async"] for r in rec.parts.writer._pending)
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
