"""The skeleton every reference trainer shares, so that each trainer file keeps only its
parallelism: parse and plan (before any process exists), start torch.distributed, build the
groups of the topology, open the recorder with a complete manifest, feed the data, run the
steps, shut down cleanly.

A trainer module provides two functions and hands them to `run_trainer`:

    plan(cfg, world_size) -> Topology     the validated layout (`Plan`); `diag run` calls it
                                          too, before torchrun starts (reference_runs/preflight.py)
    build(setup) -> Loop                  its model, optimizer and recorder, and one step

    def main(argv=None):
        run_trainer("dp", plan, build, argv)
"""

from __future__ import annotations

import datetime as _dt
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from collectors import NullRecorder, Recorder, register_recording_hook
from collectors.profiler import ProfilerWindow
from reference_runs.config import TrainConfig, parse_config
from reference_runs.data import Batch, SyntheticTokens, iterate_batches, make_loader
from reference_runs.faults import FaultPlan, Leak
from reference_runs.topology import Topology

EPOCH_STEPS = 4
"""Steps per epoch of the synthetic data: the dataset holds this many steps' samples."""

_profiler_windows: list[ProfilerWindow] = []
"""The open `--profile-steps` window of this process, closed by `shutdown`."""


class Plan(Protocol):
    """A trainer's `plan(cfg, world_size)`: the validated layout of `world_size` ranks, or a
    ValueError naming the values this trainer cannot run. It needs no process group: `diag run`
    calls it before torchrun starts (reference_runs/preflight.py), every rank before
    torch.distributed (`start`). It may settle a default of `cfg` (pp: one block per stage)."""

    def __call__(self, cfg: TrainConfig, world_size: int) -> Topology: ...


@dataclass
class Setup:
    """What `start` gives a trainer's `build`: the validated config and layout, this rank's
    process, its groups and its injections."""

    cfg: TrainConfig
    env: DistEnv
    topology: Topology
    groups: dict[str, Any]  # axis -> this rank's process group (axes of size > 1)
    faults: FaultPlan

    def open_recorder(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        params: int,
        layout: dict[str, Any],
        model_extra: dict[str, Any] | None = None,
    ) -> Recorder | NullRecorder:
        """The rank's recorder, with the manifest fields every trainer fills the same way
        (`params`: the whole model's; `model_extra`: the model fields only some trainers have,
        e.g. the MoE ones)."""
        cfg, env, topology = self.cfg, self.env, self.topology
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
        for axis, group in self.groups.items():
            rec.register_group(axis, group)
            if group is dist.group.WORLD:
                rec.register_group(axis, None)
        if cfg.profile_steps and rec.enabled:
            window = ProfilerWindow.open(rec.run_dir, env.rank, *cfg.profile_steps)  # type: ignore[union-attr]
            if window is not None:
                rec.on_step_end(window.step)
                _profiler_windows.append(window)
        return rec

    def batches(
        self, rec: Recorder | NullRecorder, replica: int, replicas: int, per_step: int
    ) -> Iterator[Batch]:
        """This rank's (input, target) micro-batches, forever, on its device: data replica
        `replica` of `replicas`, `per_step` micro-batches a step, EPOCH_STEPS steps an epoch,
        and an `epoch` event (the hash of its sample order) as each epoch starts."""
        cfg = self.cfg
        samples = cfg.micro_batch * per_step * replicas * EPOCH_STEPS
        dataset = SyntheticTokens(samples, cfg.seq, cfg.vocab, seed=cfg.seed)
        loader, sampler = make_loader(dataset, cfg.micro_batch, replica, replicas, cfg.seed)
        on_epoch = rec.event if rec.enabled else None
        batches = iterate_batches(
            loader, sampler, set_epoch=self.faults.set_epoch, on_epoch=on_epoch
        )
        return _on_device(batches, self.env.device)

    def leak(self) -> Leak | None:
        """The `leak:mb=X` injection's leak on this rank's device, None without one."""
        return self.faults.leak(self.env.device)


@dataclass
class Loop:
    """What a trainer's `build` returns: its recorder, one optimizer step (`step(step_index)`,
    which opens `rec.step`), and what to close before the recorder."""

    rec: Recorder | NullRecorder
    step: Callable[[int], None]
    close: Callable[[], None] | None = None


def accumulated_step(
    setup: Setup,
    rec: Recorder | NullRecorder,
    batches: Iterator[Batch],
    forward: Callable[[torch.Tensor, torch.Tensor], Any],
    gradient_sync: Callable[[bool], AbstractContextManager[Any]],
    optimizer: torch.optim.Optimizer,
    clip_params: list[torch.nn.Parameter],
) -> Callable[[int], None]:
    """One optimizer step of `--grad-accum` micro-batches (data, fwd, bwd spans each, then
    opt), the data-parallel trainers' step. `gradient_sync(last)` is entered around each
    micro-batch's forward and backward: the wrapper's way of reducing gradients only in the last
    (DDP's `no_sync()`, FSDP2's `set_requires_gradient_sync`)."""
    cfg, faults, leak = setup.cfg, setup.faults, setup.leak()
    tokens_per_step = cfg.micro_batch * cfg.seq * cfg.grad_accum

    def train_step(step_index: int) -> None:
        with rec.step(tokens=tokens_per_step) as step:
            for mb in range(cfg.grad_accum):
                with rec.span("data", mb=mb):
                    inputs, targets = next(batches)
                with gradient_sync(mb == cfg.grad_accum - 1):
                    with rec.span("fwd", mb=mb):
                        faults.apply_failure(step_index, rec)  # hang, crash, desync, kill
                        faults.apply_compute_delay(step_index)
                        _, loss = forward(inputs, targets)
                        if leak is not None:
                            leak.step()
                    with rec.span("bwd", mb=mb):
                        (loss / cfg.grad_accum).backward()
            with rec.span("opt"):
                if cfg.clip_grad is not None:
                    clip_gradients(rec, clip_params, cfg.clip_grad)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            step.loss = loss.item()

    return train_step


def run_trainer(
    trainer: str, plan: Plan, build: Callable[[Setup], Loop], argv: list[str] | None
) -> None:
    """Start (`start`), build the trainer, run its steps, shut down (`shutdown`)."""
    setup = start(trainer, plan, argv)
    loop = build(setup)
    rec, failed = loop.rec, True
    try:
        for step_index in range(setup.cfg.steps):
            setup.faults.apply_loader_stall()  # the data fetch of `loader-stall`, unrecorded
            loop.step(step_index)
        failed = False
    finally:
        if loop.close is not None:
            loop.close()
        del loop  # the trainer's wrappers go before the groups (see `shutdown`)
        shutdown(rec, failed=failed)


def start(trainer: str, plan: Plan, argv: list[str] | None) -> Setup:
    """Parse `argv` and plan the layout before any process group exists (on a bad one every
    rank exits 2, rank 0 saying why), then start torch.distributed, build the groups, parse the
    injections and seed torch."""
    cfg = parse_config(argv, trainer)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    say = os.environ.get("RANK", "0") == "0"
    topology = checked_plan(plan, cfg, world_size, f"reference_runs.{trainer}", say)
    rank = int(os.environ.get("RANK", "0"))
    stage = topology.coords(rank)["pp"]
    faults = FaultPlan.from_specs(cfg.inject, rank, stage=stage, seed=cfg.seed)
    timeout_s = faults.pg_timeout_s()  # short under a failure injection: the job ends in seconds
    timeout = _dt.timedelta(seconds=timeout_s) if timeout_s is not None else None
    env = init_distributed(timeout)
    groups = build_groups(topology, env.rank, timeout)
    torch.manual_seed(cfg.seed)  # every rank builds the same full model, then keeps its part
    return Setup(cfg, env, topology, groups, faults)


def checked_plan(plan: Plan, cfg: TrainConfig, world_size: int, prog: str, say: bool) -> Topology:
    """`plan(cfg, world_size)`, or exit 2, after one line `PROG: error: REASON` if `say`."""
    try:
        return plan(cfg, world_size)
    except ValueError as exc:
        if say:
            print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


BACKEND_ENV = "DIAG_BACKEND"
"""Overrides the process group's backend: `gloo` lets ranks share a GPU (NCCL refuses two ranks
on one device), with CUDA tensors (benchmarks/gpu_check.py)."""


def init_distributed(timeout: _dt.timedelta | None = None) -> DistEnv:
    """NCCL and one GPU per rank when GPUs are present, otherwise gloo on CPU. More ranks than
    GPUs share them (rank i on GPU i mod count), which only a backend other than NCCL allows
    ($DIAG_BACKEND=gloo)."""
    torch.set_num_threads(1)  # several ranks share this machine's cores
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = os.environ.get(BACKEND_ENV) or "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, timeout=timeout)
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def build_groups(
    topology: Topology, rank: int, timeout: _dt.timedelta | None = None
) -> dict[str, Any]:
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
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                mine[axis] = group
    return mine


def default_run_dir(trainer: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{trainer}-{stamp}")


def _on_device(batches: Iterator[Batch], device: torch.device) -> Iterator[Batch]:
    for inputs, targets in batches:
        yield inputs.to(device), targets.to(device)


def clip_gradients(
    rec: Recorder | NullRecorder, params: list[torch.nn.Parameter], max_norm: float
) -> float:
    """Clip the gradients to the global norm `max_norm` and record both norms (`grad_norm`).

    `local` is the norm of the gradients this rank holds (under ZeRO-3 its shard only: clipping on
    it under-clips, pitfall 5 of docs/physics.md); `global` is what `clip_grad_norm_` computes over
    all of them (DTensor shards all-reduced). Under DDP the two are equal.
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


def hook_ddp(
    rec: Recorder | NullRecorder, ddp: DDP, delay_s: float, process_group: Any = None
) -> None:
    """Record the gradient all-reduces of `ddp` over `process_group` (None: the world), each
    after `delay_s` of injected latency (slow-comm); with the collectors off, the latency
    alone, before DDP's own all-reduce."""
    if rec.enabled:
        register_recording_hook(
            rec,  # type: ignore[arg-type]
            ddp,
            process_group=process_group,
            before_launch=(lambda: time.sleep(delay_s)) if delay_s else None,
        )
    elif delay_s:
        ddp.register_comm_hook(process_group, delayed_allreduce_hook(delay_s))


def delayed_allreduce_hook(delay_s: float) -> Any:
    """DDP's default all-reduce after `delay_s` of extra latency (slow-comm, collectors off);
    its state is the process group to all-reduce over (None: the world)."""
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
