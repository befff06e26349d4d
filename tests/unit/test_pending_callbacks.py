"""Callbacks a collector hands to torch futures are held until the thread that completes the
future frees them, so a job that exits right after its last collective never aborts at exit
(collectors/pending.py). The abort itself is a race too rare for a suite test; these check the
mechanism on a real gloo group and on the DDP hook a real DDP model calls."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from collector_helpers import free_port, gloo_world  # noqa: F401 - gloo_world: the fixture `world`
from torch.nn.parallel import DistributedDataParallel as DDP

from collectors import Recorder, register_recording_hook
from collectors.pending import PENDING, PendingCallbacks


def test_callbacks_on_gloo_futures_are_counted_until_freed(world: None) -> None:
    pending = PendingCallbacks()
    tensor = torch.ones(4096)
    futures = []
    for _ in range(8):
        work = dist.all_reduce(tensor, async_op=True)
        futures.append(work.get_future().then(pending.track(lambda f: f.value())))
    for future in futures:
        future.wait()
    assert pending.drain(timeout_s=5.0)
    assert pending.count == 0


def test_a_callback_that_is_never_released_does_not_hold_exit() -> None:
    pending = PendingCallbacks()
    never = torch.futures.Future()  # nobody completes it: its callback stays owned
    never.then(pending.track(lambda f: None))
    start = time.monotonic()
    assert not pending.drain(timeout_s=0.05)
    assert pending.count == 1
    assert time.monotonic() - start < 1.0


def test_the_ddp_hook_hands_over_only_tracked_callbacks(world: None, tmp_path: Path) -> None:
    model = DDP(torch.nn.Linear(16, 4))
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, model=model)
    register_recording_hook(rec, model)
    handed = PENDING.handed
    with rec.step():
        model(torch.randn(8, 16)).sum().backward()
    assert PENDING.handed > handed  # the hook's completion callback went through the count
    assert PENDING.drain(timeout_s=5.0), f"{PENDING.count} callbacks never freed"
    rec.close()


@pytest.mark.parametrize("closed", [True, False])
def test_a_recorded_ddp_model_dies_with_the_users_last_reference(
    world: None, tmp_path: Path, closed: bool
) -> None:
    """The reducer holds the hook's state, which holds the recorder: were the recorder (or the
    exit flush that keeps an unclosed one) to hold the model, the model would outlive the
    user's `destroy_process_group()` and die in interpreter teardown, where its reducer can
    abort a finished job. Checked before any destroy, closed or not."""
    import gc
    import weakref

    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, model=model, optimizer=opt)
    register_recording_hook(rec, model)
    for _ in range(2):
        with rec.step():
            loss = model(torch.randn(8, 16)).sum()
            loss.backward()
            opt.step()
    assert rec.model is model
    if closed:
        rec.close()
    alive = weakref.ref(model)
    del model, opt, loss
    gc.collect()
    assert alive() is None, "the recorder kept the DDP model alive"
    assert rec.model is None
    rec.close()


def test_closing_after_the_process_group_is_destroyed(tmp_path: Path) -> None:
    """The user's order is theirs: the group destroyed first, the recorder closed after, and
    the run is still complete."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    model = DDP(torch.nn.Linear(16, 4))
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, model=model)
    register_recording_hook(rec, model)
    with rec.step():
        model(torch.randn(8, 16)).sum().backward()
    dist.destroy_process_group()
    rec.close()
    assert (tmp_path / "run" / "rank-00000.arrows").stat().st_size > 0
