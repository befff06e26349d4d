"""The seed's memory pitfalls made observable, in one process: activations that grow with seq
squared under naive attention, the device budget (`oom_risk`), the data order per epoch (a
forgotten `set_epoch`), parameters saved for backward not counted as activations, the local
and global gradient norms of clipping; and FSDP2's collectives and unsharded buffers as the
collectors see them, in a 2-rank world of torch's fake backend (no data moves)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from collectors import Recorder
from collectors.fsdp import register_fsdp_recording
from collectors.memory import SavedTensorTracker
from diag.rankfile.convert import rank_file, rank_records
from reference_runs.common import clip_gradients
from reference_runs.config import parse_config
from reference_runs.data import SyntheticTokens, iterate_batches, make_loader, order_hash
from reference_runs.model import GPT, GPTConfig

torch.set_num_threads(1)

SIX = ("params", "grads", "optimizer", "activations", "comm_buffers", "fragmentation")


def records(run_dir: Path, kind: str, **match: Any) -> list[dict[str, Any]]:
    path = rank_file(run_dir, 0)
    assert path is not None
    out = rank_records(path)
    return [r for r in out if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())]


def train_steps(rec: Recorder, model: nn.Module, optimizer: Any, batches: Any, steps: int) -> None:
    for _ in range(steps):
        with rec.step() as step:
            with rec.span("data"):
                inputs, targets = next(batches)
            with rec.span("fwd"):
                _, loss = model(inputs, targets)
            with rec.span("bwd"):
                loss.backward()
            with rec.span("opt"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            step.loss = loss.item()


# ---------------------------------------------------------------- activations vs sequence length


def activation_bytes(tmp_path: Path, seq: int, attention: str) -> int:
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(layers=1, hidden=64, heads=4, seq_len=seq, vocab=128, attention=attention)
    )
    run_dir = tmp_path / f"{attention}-{seq}"
    rec = Recorder(run_dir, model=model)
    tokens = torch.randint(128, (2, seq + 1), generator=torch.Generator().manual_seed(0))
    with rec.step(), rec.span("fwd"):
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
    assert loss is not None
    loss.backward()
    rec.close()
    (mem,) = records(run_dir, "mem")
    return int(mem["activations"])


def test_naive_attention_grows_activations_faster_than_linearly(tmp_path: Path) -> None:
    """4x the sequence: sdpa keeps ~4x the activations (no seq x seq tensor saved); naive
    attention keeps the heads x seq x seq softmax output too, the 5*a*s/h term of Korthikanti
    et al. (arXiv 2205.05198), so clearly more than 4x (measured: 6.0x for this model)."""
    naive = activation_bytes(tmp_path, 256, "naive") / activation_bytes(tmp_path, 64, "naive")
    sdpa = activation_bytes(tmp_path, 256, "sdpa") / activation_bytes(tmp_path, 64, "sdpa")
    assert sdpa == pytest.approx(4.0, rel=0.05)
    assert naive > 5.0


def test_naive_and_sdpa_attention_compute_the_same_function() -> None:
    torch.manual_seed(0)
    sdpa = GPT(GPTConfig(layers=2, hidden=64, heads=4, seq_len=32, vocab=128))
    naive = GPT(GPTConfig(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, attention="naive"))
    naive.load_state_dict(sdpa.state_dict())
    idx = torch.randint(128, (2, 32))
    torch.testing.assert_close(naive(idx)[0], sdpa(idx)[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="attention"):
        GPTConfig(attention="flash")


# ---------------------------------------------------------------- device budget


def small_run(tmp_path: Path, budget: int | None, steps: int = 3) -> Path:
    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=1, hidden=32, heads=2, seq_len=16, vocab=64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = Recorder.from_env(
        tmp_path, model=model, optimizer=optimizer, hardware={"device_memory_bytes": budget}
    )
    assert isinstance(rec, Recorder)
    rec.set_comm_buffer("declared", 1000)
    dataset = SyntheticTokens(8, 16, 64)
    batches = iterate_batches(*make_loader(dataset, 2, 0, 1, seed=0), set_epoch=True)
    train_steps(rec, model, optimizer, batches, steps)
    rec.close()
    return tmp_path


def test_oom_risk_is_recorded_once_per_step_over_the_budget(tmp_path: Path) -> None:
    run_dir = small_run(tmp_path, budget=100_000)
    risks = records(run_dir, "event", name="oom_risk")
    assert [r["step"] for r in risks] == [0, 1, 2]
    for risk, mem in zip(risks, records(run_dir, "mem"), strict=True):
        assert risk["budget_bytes"] == 100_000
        assert all(risk[c] == mem[c] for c in SIX)  # the breakdown of that step
        assert risk["total_bytes"] == sum(mem[c] or 0 for c in SIX) > 100_000
        assert risk["comm_buffers"] == 1000 and risk["fragmentation"] is None


@pytest.mark.parametrize("budget", [None, 10**12])
def test_no_oom_risk_without_budget_or_within_it(tmp_path: Path, budget: int | None) -> None:
    run_dir = small_run(tmp_path, budget=budget)
    assert not records(run_dir, "event", name="oom_risk")
    assert len(records(run_dir, "mem")) == 3


# ---------------------------------------------------------------- data order per epoch


@pytest.mark.parametrize("set_epoch", [True, False])
def test_epoch_hashes_expose_a_forgotten_set_epoch(set_epoch: bool) -> None:
    dataset = SyntheticTokens(20, 8, 32)
    events: list[dict[str, Any]] = []
    per_rank = []
    for rank in (0, 1):
        loader, sampler = make_loader(dataset, 3, rank, 2, seed=0)  # 10 samples, 3 batches
        batches = iterate_batches(
            loader, sampler, set_epoch, on_epoch=lambda name, **f: events.append(f)
        )
        seen = [next(batches)[0] for _ in range(3 * len(loader))]  # three epochs
        per_rank.append(seen)
        mine = events[-3:]
        assert [e["epoch"] for e in mine] == [0, 1, 2]
        assert all(e["samples"] == 9 for e in mine)  # drop_last: 3 batches of 3
        hashes = [e["order_hash"] for e in mine]
        if set_epoch:
            assert len(set(hashes)) == 3
        else:
            assert len(set(hashes)) == 1
            assert all(torch.equal(a, b) for a, b in zip(seen[:3], seen[3:6], strict=True))
    assert events[0]["order_hash"] != events[3]["order_hash"]  # ranks see different samples
    assert order_hash([1, 2, 3]) == order_hash([1, 2, 3]) != order_hash([1, 3, 2])


# ---------------------------------------------------------------- saved parameters


def test_parameters_and_their_views_saved_for_backward_are_not_activations() -> None:
    """A linear saves `weight.t()`; an FSDP2 unsharded parameter is a fresh Parameter whose
    storage is emptied in place on reshard: neither may count (or linger) as an activation."""
    tracker = SavedTensorTracker()
    weight = nn.Parameter(torch.randn(64, 64))  # not watched: like FSDP2's unsharded params
    x = torch.randn(8, 64, requires_grad=True)
    with tracker.hooks():
        y = (x @ weight.t()).sum()  # saves x (2 KiB) and weight.t() (16 KiB, a view)
        z = (weight * 2).sum()  # saves nothing of weight (a constant factor)
    assert tracker.peak_bytes == x.numel() * 4
    weight.untyped_storage().resize_(0)  # what FSDP2's reshard does
    del y, z, x  # the graph and the input go: nothing saved is left
    assert tracker.live_bytes == 0


# ---------------------------------------------------------------- gradient clipping


def test_clip_gradients_records_local_and_global_norm(tmp_path: Path) -> None:
    model = nn.Linear(4, 4)
    model(torch.ones(2, 4)).sum().backward()
    expected = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    rec = Recorder(tmp_path, model=model)
    total = clip_gradients(rec, list(model.parameters()), max_norm=0.1)
    rec.close()
    (event,) = records(tmp_path, "event", name="grad_norm")
    # one process holds every gradient: local and global agree (ZeRO-3: see test_zero3.py)
    assert event["local"] == pytest.approx(event["global"]) == pytest.approx(expected.item())
    assert total == pytest.approx(expected.item())
    assert event["max_norm"] == 0.1 and event["clipped"] is True
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert clipped.item() == pytest.approx(0.1, rel=1e-4)


def test_options_of_the_pitfalls() -> None:
    cfg = parse_config(["--attention", "naive", "--clip-grad", "1.5"], "zero3")
    assert cfg.gpt_config().attention == "naive" and cfg.clip_grad == 1.5
    assert parse_config([], "dp").clip_grad is None
    with pytest.raises(SystemExit):
        parse_config(["--clip-grad", "1"], "tp")  # TP does not know its global norm
    with pytest.raises(SystemExit):
        parse_config(["--attention", "flash"], "dp")


# ---------------------------------------------------------------- FSDP2 in a fake 2-rank world


@pytest.fixture
def fake_world() -> Iterator[Any]:
    """Rank 0 of 2 on torch's fake backend: collectives return at once, shapes are real."""
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    finally:
        dist.destroy_process_group()


def sharded_gpt(mesh: Any) -> tuple[GPT, list[tuple[Any, int | None]]]:
    from reference_runs.zero3 import shard_model

    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=2, hidden=32, heads=2, seq_len=16, vocab=64))
    return model, shard_model(model, mesh)


def fsdp_steps(run_dir: Path, mesh: Any, recording: bool, steps: int = 2) -> GPT:
    model, units = sharded_gpt(mesh)
    rec = Recorder(run_dir, rank=0, world_size=2, model=model)  # from_env's barrier needs data
    rec.trace_collectives()
    if recording:
        register_fsdp_recording(rec, units)
    idx = torch.randint(64, (2, 17), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        with rec.step():
            with rec.span("fwd"):
                _, loss = model(idx[:, :-1], idx[:, 1:])
            assert loss is not None
            with rec.span("bwd"):
                loss.backward()
    rec.close()
    return model


def unit_bytes() -> tuple[int, int]:
    """Unsharded bytes of one block and of the root unit (embeddings, tied head, ln_f)."""
    gpt = GPT(GPTConfig(layers=2, hidden=32, heads=2, seq_len=16, vocab=64))
    block = 4 * sum(p.numel() for p in gpt.blocks[0].parameters())
    return block, 4 * sum(p.numel() for p in gpt.parameters()) - 2 * block


def test_the_tracer_sees_fsdp2_collectives_through_torch_distributed(
    tmp_path: Path, fake_world: Any
) -> None:
    """FSDP2 (torch 2.13) looks up dist.all_gather_single / reduce_scatter_single at call time:
    the plain tracer sees them, but cannot tell units or forward from backward."""
    fsdp_steps(tmp_path, fake_world, recording=False)
    block, root = unit_bytes()
    comms = records(tmp_path, "comm", step=1)
    assert [(c["op"], c["bytes"], c["tag"]) for c in comms] == [
        ("all_gather", root, None),  # forward: root, block 0, block 1
        ("all_gather", block, None),
        ("all_gather", block, None),
        ("all_gather", block, None),  # backward: block 1, block 0 (prefetched)
        ("all_gather", block, None),
        ("reduce_scatter", block, None),  # block 1, block 0, root
        ("reduce_scatter", block, None),
        ("reduce_scatter", root, None),
    ]


def test_fsdp_recording_tags_units_and_counts_unsharded_buffers_once(
    tmp_path: Path, fake_world: Any
) -> None:
    fsdp_steps(tmp_path, fake_world, recording=True)
    block, root = unit_bytes()
    comms = records(tmp_path, "comm", step=1)  # the tracer, still installed, adds nothing
    assert [(c["op"], c["tag"], c["layer"]) for c in comms] == [
        ("all_gather", "fsdp.ag.fwd", None),
        ("all_gather", "fsdp.ag.fwd", 0),
        ("all_gather", "fsdp.ag.fwd", 1),
        ("all_gather", "fsdp.ag.bwd", 1),
        ("all_gather", "fsdp.ag.bwd", 0),
        ("reduce_scatter", "fsdp.rs", 1),
        ("reduce_scatter", "fsdp.rs", 0),
        ("reduce_scatter", "fsdp.rs", None),
    ]
    assert all(c["bytes"] == c["expected_bytes"] == (block if c["layer"] is not None else root)
               for c in comms)  # fmt: skip
    assert Counter(c["group_size"] for c in comms) == {2: 8}
    mem = records(tmp_path, "mem")
    # the backward peak: the root (gathered since forward), block 1 and block 0's prefetch
    assert [m["comm_buffers"] for m in mem] == [root + 2 * block] * 2
    assert all(m["params"] == (root + 2 * block) // 2 for m in mem)  # the local shards

    # the unsharded weights autograd saves are comm buffers, not activations: the sharded
    # model keeps exactly the activations of the same model unsharded
    torch.manual_seed(0)
    plain = GPT(GPTConfig(layers=2, hidden=32, heads=2, seq_len=16, vocab=64))
    plain_dir = tmp_path / "plain"
    rec = Recorder(plain_dir, model=plain)
    idx = torch.randint(64, (2, 17), generator=torch.Generator().manual_seed(0))
    with rec.step(), rec.span("fwd"):
        _, _loss = plain(idx[:, :-1], idx[:, 1:])  # the graph stays alive to the end
    rec.close()
    (plain_mem,) = records(plain_dir, "mem")
    assert [m["activations"] for m in mem] == [plain_mem["activations"]] * 2
