"""What every reference trainer does the same way: start torch.distributed, build the groups of
the topology, open the recorder with a complete manifest, and shut down cleanly."""

from __future__ import annotations

import datetime as _dt
import gc
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from collectors import NullRecorder, Recorder
from collectors.profiler import ProfilerWindow
from reference_runs.config import TrainConfig
from reference_runs.topology import Topology

_profiler_windows: list[ProfilerWindow] = []
"""The open `--profile-steps` window of this process, closed by `shutdown`."""


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def init_distributed() -> DistEnv:
    """NCCL and one GPU per rank when GPUs are present, otherwise gloo on CPU."""
    torch.set_num_threads(1)  # several ranks share this machine's cores
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend)
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def build_groups(topology: Topology, rank: int) -> dict[str, Any]:
    """This rank's process group for each axis of size > 1 (`dist.group.WORLD` for the whole
    world). Every rank creates every group, in the same order, as new_group requires."""
    mine: dict[str, Any] = {}
    for axis, size in topology.sizes().items():
        if size == 1:
            continue
        if size == topology.world_size:
            mine[axis] = dist.group.WORLD
            continue
        for ranks in topology.groups(axis):
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[axis] = group
    return mine


def default_run_dir(trainer: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{trainer}-{stamp}")


def open_recorder(
    cfg: TrainConfig,
    env: DistEnv,
    topology: Topology,
    groups: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    params: int,
    layout: dict[str, Any],
    model_extra: dict[str, Any] | None = None,
) -> Recorder | NullRecorder:
    """The rank's recorder, with the manifest fields every trainer fills the same way
    (`model_extra`: the model fields only some trainers have, e.g. the MoE ones)."""
    device_memory = (
        int(cfg.device_memory_gb * 1e9)
        if cfg.device_memory_gb
        else torch.cuda.get_device_properties(env.device).total_memory
        if env.device.type == "cuda"
        else None
    )
    rec = Recorder.from_env(
        cfg.out or default_run_dir(cfg.trainer),
        model=model,
        optimizer=optimizer,
        trainer=cfg.trainer,
        layout={**{str(k): v for k, v in topology.sizes().items()}, **layout},
        model_info={
            "layers": cfg.layers,
            "hidden": cfg.hidden,
            "heads": cfg.heads,
            "seq_len": cfg.seq,
            "micro_batch": cfg.micro_batch,
            "vocab": cfg.vocab,
            "ffn_hidden": 4 * cfg.hidden,
            "params": params,
            "dtype": "float32",
            "attention": cfg.attention,
            **(model_extra or {}),
        },
        groups=topology.all_groups(),
        hardware={"gpus_per_node": cfg.gpus_per_node, "device_memory_bytes": device_memory},
        injections=list(cfg.inject),
        device=env.device,
        enabled=not cfg.no_collectors,
    )
    for axis, group in groups.items():
        rec.register_group(axis, group)
        if group is dist.group.WORLD:
            rec.register_group(axis, None)
    if cfg.profile_steps and rec.enabled:
        window = ProfilerWindow.open(rec.run_dir, env.rank, *cfg.profile_steps)  # type: ignore[union-attr]
        if window is not None:
            rec.on_step_end(window.step)
            _profiler_windows.append(window)
    return rec


def clip_gradients(
    rec: Recorder | NullRecorder, params: list[torch.nn.Parameter], max_norm: float
) -> float:
    """Clip the gradients to the global norm `max_norm` and record both norms (`grad_norm`).

    `local` is the norm of the gradients this rank holds (under ZeRO-3 its shard only: clipping
    on it under-clips, failure 5 of the seed digest); `global` is what `clip_grad_norm_`
    computes over all of them (DTensor shards all-reduced). Under DDP the two are equal.
    """
    grads = [p.grad for p in params if p.grad is not None]
    local_grads = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    local = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g) for g in local_grads])
    )
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    norms = {"local": local.item(), "global": total.item()}
    rec.event("grad_norm", **norms, max_norm=max_norm, clipped=norms["global"] > max_norm)
    return norms["global"]


def delayed_allreduce_hook(delay_s: float) -> Any:
    """DDP's default all-reduce after `delay_s` of extra latency (slow-comm, collectors off)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    # unannotated: DDP checks a hook's annotations, and PEP 563 would make them strings
    def hook(process_group, bucket):  # type: ignore[no-untyped-def]
        time.sleep(delay_s)
        return allreduce_hook(process_group, bucket)

    return hook


def exit_process(code: int = 0) -> NoReturn:
    """End a trainer process that has finished (recorder closed, process groups destroyed)
    without running the interpreter's and C++ libraries' teardown: gloo's and DDP's native
    objects destroyed at exit can abort a process whose run completed ("terminate called
    without an active exception", SIGABRT, seen about once in a few hundred runs), which
    torchrun reports as a failed run. Everything the run wrote is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def shutdown(rec: Recorder | NullRecorder, failed: bool = False) -> None:
    """Close the recorder, then destroy the process groups while the interpreter is whole.

    The caller drops its wrappers first (`del ddp`): DDP's reducer keeps the last step's futures,
    whose callbacks are Python objects. Left to interpreter teardown, gloo's worker threads can
    be the ones to free them, which aborts the process ("terminate called without an active
    exception", SIGABRT) after a run that completed. `gc.collect()` frees them now, cycles too.
    """
    for window in _profiler_windows:
        window.close()  # writes RUN/traces/ if the window did not end on its own
    _profiler_windows.clear()
    rec.close("failed" if failed else "complete")
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
