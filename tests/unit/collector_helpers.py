"""Helpers shared by the collector unit tests (imported by test_collectors / test_tracer)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import collectors.memory
import collectors.safety
from collectors import Recorder
from collectors.comm import CollectiveTracer
from reference_runs.faults import Leak
from tests.conftest import raw_records

torch.set_num_threads(1)

SIX = ("params", "grads", "optimizer", "activations", "comm_buffers", "fragmentation")
MiB = 2**20


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


def free_port() -> int:
    """A TCP port free on this machine now (for a gloo group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(name="world")
def gloo_world() -> Iterator[None]:
    """The fixture `world`: a 1-rank gloo world for the test, destroyed after it (imported as
    `gloo_world`, so that the tests' `world` argument does not shadow the import)."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def read_records(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    """The rank's records as written, whichever format the recorder wrote (Arrow by default)."""
    return raw_records(run_dir, rank)


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
