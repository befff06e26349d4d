"""The per-rank recorder: steps, spans, collectives, memory, experts and events to RUN/rank-N.arrows
(an Arrow IPC stream; `format="jsonl"` or DIAG_RANK_FORMAT=jsonl: RUN/rank-N.jsonl).

    rec = Recorder.from_env("runs/my-job", model=model, optimizer=opt, trace_collectives=True)
    for batch in loader:
        with rec.step(tokens=batch.numel()) as step:
            with rec.span("fwd"):
                loss = model(batch)
            with rec.span("bwd"):
                loss.backward()
            with rec.span("opt"):
                opt.step(); opt.zero_grad()
            step.loss = loss.item()
    rec.close()

Every method is guarded: an error inside the recorder is logged once and training goes on.
`Recorder.disabled()` (or `enabled=False`, or DIAG_COLLECTORS=0) gives a recorder that does
nothing at all.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from collectors.clock import Clock
from collectors.comm import CollectiveTracer, CommEvent
from collectors.comm_records import GroupRecords
from collectors.contexts import CollectiveContext, SpanContext, StepContext, TagContext
from collectors.device import CudaSpanTimer, NvmlSampler
from collectors.host import HostSampler
from collectors.inflight import InFlight
from collectors.manifest import (
    DataParallel,
    build_manifest,
    declare_data_parallel,
    gather_rank_infos,
)
from collectors.memory import SavedTensorTracker, memory_breakdown
from collectors.null import NullContext, NullRecorder
from collectors.parts import RecorderParts
from collectors.recorder_end import RecorderEnd, track_open
from collectors.safety import guarded, report_once
from collectors.watchdog import (
    Watchdog,
    WatchdogConfig,
    watchdog_enabled,
)
from collectors.writer import RankFormat, open_rank_writer
from diag.contract.schema import MEMORY_CATEGORIES, Phase, write_manifest

_PHASES = {p.value for p in Phase}
Batch = TypeVar("Batch")


class Recorder(RecorderEnd):
    """Writes one rank's records; create it with `Recorder.from_env` after init_process_group."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int = 0,
        world_size: int = 1,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        device: torch.device | None = None,
        track_activations: bool = True,
        activation_every: int = 10,
        memory_budget_bytes: int | None = None,
        format: RankFormat | None = None,
        watchdog: bool | None = None,
        stall_factor: float | None = None,
        stall_floor_s: float | None = None,
        heartbeat_s: float | None = None,
    ) -> None:
        # PyTorch's Flight Recorder (the stall evidence, collectors/watchdog.py) keeps entries
        # only with a buffer; torch 2.13 has one by default, older ones read this when their
        # first process group is made. The user's own value wins.
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.world_size = world_size
        self._model_ref: weakref.ref[torch.nn.Module] | None = None
        self.optimizer = optimizer
        self.device = device or torch.device("cpu")
        self.clock = Clock()
        self.enabled = True
        self.step_index = 0
        self.steps_completed = 0
        # What the step and span contexts share with the recorder (collectors/parts.py). The
        # writer's format: "arrow" (.arrows, docs/run-format.md) or "jsonl"; None:
        # $DIAG_RANK_FORMAT. The host sampler is built here, on the training thread: its
        # counters are that thread's.
        self.parts = RecorderParts(
            writer=open_rank_writer(self.run_dir, rank, format),
            host=HostSampler(),
            nvml=NvmlSampler.create(self.device),
            cuda_timer=CudaSpanTimer.create(self.device),
            activations=SavedTensorTracker() if track_activations else None,
        )
        # Saved-tensor hooks cost a Python call per saved tensor, so activations are measured
        # on the first 3 steps and every `activation_every`-th step after (null on the others).
        self.activation_every = max(int(activation_every), 1)
        self._comm_buffers: dict[str, int] = {}
        # The device budget the six categories are checked against at every step end (oom_risk).
        self.memory_budget_bytes = memory_budget_bytes
        self.phase: str | None = None  # the phase of the innermost open span (fwd, bwd, ...)
        self.groups = GroupRecords(world_size)  # names, sizes and `seq` of the process groups
        self._close_callbacks: list[Callable[[], None]] = []
        self._tracer: CollectiveTracer | None = None
        # The parameter list is read once: listing a deep module's parameters costs more than
        # measuring them. Call `watch()` after replacing the model's parameters.
        self.watch(model, optimizer)
        self._manifest: Any = None
        self._layout_keys: set[str] = set()  # the layout fields the user gave (never inferred)
        self._closed = False
        # What is open now (the step, spans, issued collectives) and the last progress: the
        # watchdog reads it, every flush writes it (collectors/inflight.py).
        self.inflight = InFlight()
        self.main_thread_id = threading.get_ident()  # the training thread: a stall keeps its stack
        track_open(self)
        self._watchdog: Watchdog | None = None
        if watchdog_enabled(watchdog):
            config = WatchdogConfig.resolve(stall_factor, stall_floor_s, heartbeat_s)
            self._watchdog = Watchdog(self, config).start()

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_env(
        cls,
        run_dir: str | os.PathLike[str],
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        trainer: str = "custom",
        layout: dict[str, Any] | None = None,
        model_info: dict[str, Any] | None = None,
        groups: dict[str, list[list[int]]] | None = None,
        hardware: dict[str, Any] | None = None,
        injections: list[str] | None = None,
        trace_collectives: bool = False,
        track_activations: bool = True,
        activation_every: int = 10,
        device: torch.device | None = None,
        enabled: bool = True,
        format: RankFormat | None = None,
        watchdog: bool | None = None,
        stall_factor: float | None = None,
        stall_floor_s: float | None = None,
        heartbeat_s: float | None = None,
    ) -> Recorder | NullRecorder:
        """Build the recorder of this rank from torchrun's environment (RANK, WORLD_SIZE, ...).

        Rank 0 writes the manifest. When torch.distributed is initialised, all ranks meet at a
        start barrier that aligns clocks across hosts, so every rank must call this.
        `layout` ({"dp": 4, "tp": 2, ...}, the manifest's fields) is what the analysis holds the
        run against; without it, registering DDP or FSDP2 sets `dp` (and FSDP2's ZeRO stage)
        from the wrapper's group, and every other dimension is 1.
        The watchdog's knobs (`watchdog`, `stall_factor`, `stall_floor_s`, `heartbeat_s`; None:
        the environment's DIAG_WATCHDOG, DIAG_STALL_FACTOR, ...) are collectors/watchdog.py's.
        """
        if not enabled or os.environ.get("DIAG_COLLECTORS", "1") == "0":
            return NullRecorder()
        initialised = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if initialised else int(os.environ.get("RANK", 0))
        world = dist.get_world_size() if initialised else int(os.environ.get("WORLD_SIZE", 1))
        rec = cls(
            run_dir,
            rank=rank,
            world_size=world,
            model=model,
            optimizer=optimizer,
            device=device,
            track_activations=track_activations,
            activation_every=activation_every,
            memory_budget_bytes=(hardware or {}).get("device_memory_bytes"),
            format=format,
            watchdog=watchdog,
            stall_factor=stall_factor,
            stall_floor_s=stall_floor_s,
            heartbeat_s=heartbeat_s,
        )
        gpus_per_node = (hardware or {}).get("gpus_per_node")
        physical_host = socket.gethostname()
        correction_ns = rec.clock.align(dist, physical_host) if initialised else 0
        ranks = gather_rank_infos(dist if initialised else None, rec.device, gpus_per_node)
        rec._write_meta(physical_host, correction_ns, ranks[rank].host)
        if rank == 0:
            rec._manifest = build_manifest(
                run_dir=rec.run_dir,
                world_size=world,
                trainer=trainer,
                backend=dist.get_backend() if initialised else None,
                device_type=rec.device.type,
                layout=layout,
                model_info=model_info,
                ranks=ranks,
                groups=groups,
                hardware=hardware,
                injections=injections,
            )
            write_manifest(rec.run_dir, rec._manifest)
        rec._layout_keys = set(layout or {})
        if trace_collectives:
            rec.trace_collectives()
        return rec

    def _write_meta(self, physical_host: str, correction_ns: int, host: str | None) -> None:
        self.parts.writer.write(
            {
                "kind": "meta",
                "step": None,
                "rank": self.rank,
                "world_size": self.world_size,
                "host": host,
                "physical_host": physical_host,
                "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
                "pid": os.getpid(),
                "clock_offset_ns": self.clock.offset_ns,
                "clock_correction_ns": correction_ns,
            }
        )
        self.parts.writer.flush()

    @guarded()
    def watch(
        self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        """Measure this model's parameters and gradients (and this optimizer's state)."""
        self._model_ref = weakref.ref(model) if model is not None else None
        self.optimizer = optimizer if optimizer is not None else self.optimizer
        self.parts.params = list(model.parameters()) if model is not None else None
        if self.parts.activations is not None and self.parts.params is not None:
            self.parts.activations.exclude(self.parts.params)

    @property
    def model(self) -> torch.nn.Module | None:
        """The measured model, held weakly. A DDP model's reducer (C++) holds the recording
        hook's state, which holds this recorder: a strong reference back would make a cycle no
        garbage collector can see, and the model would outlive the user's
        `destroy_process_group()` to be freed in interpreter teardown, where its reducer's
        destructor can abort a finished job (collectors/pending.py)."""
        return self._model_ref() if self._model_ref is not None else None

    # ----------------------------------------------------------------- groups
    def register_group(self, name: str, group: Any) -> None:
        """Name a process group by its parallel dimension (`dp`, `tp`, `pp`, `ep`)."""
        self.groups.register(name, group)

    @guarded()
    def declare_data_parallel(self, dp: DataParallel) -> None:
        """A DDP or FSDP2 wrapper synchronises gradients over `dp.group`: name it `dp`, infer the
        layout's `dp` (and ZeRO stage) unless the user gave them, and write a `grad_sync` event
        (what the no-sync pitfall rule checks the recorded collectives against).

        Every rank must call it (a DP group smaller than the world is gathered from all ranks).
        """
        if not self.groups.is_named(dp.group):
            self.register_group("dp", dp.group)
        all_groups = declare_data_parallel(dist, dp, self.world_size)
        if self._manifest is not None:
            manifest = self._manifest
            if "dp" not in self._layout_keys:
                manifest.layout.dp = dp.size
            if "zero_stage" not in self._layout_keys and dp.zero_stage:
                manifest.layout.zero_stage = dp.zero_stage
            manifest.groups.setdefault("dp", all_groups)
            write_manifest(self.run_dir, manifest)
        self.event(
            "grad_sync", wrapper=dp.wrapper, group="dp", group_size=dp.size, tag=dp.tag,
            hook=dp.hook,
        )  # fmt: skip

    def group_name(self, group: Any) -> str:
        return self.groups.name(group)

    # ----------------------------------------------------------------- steps and spans
    def step(self, tokens: int | None = None) -> StepContext | NullContext:
        return StepContext(self, tokens)

    def iterate(self, loader: Iterable[Batch]) -> Iterator[Batch]:
        """The loader's batches, each fetch recorded as a `data` span of the step it feeds:

            for batch in rec.iterate(loader):
                with rec.step(tokens=batch.numel()):
                    ...

        The step then begins where its fetch began, so the time a slow loader costs is its
        rank's (host time inside the step), not an unrecorded gap between steps.
        """
        batches = iter(loader)
        while True:
            t0 = self.inflight.fetch_t0 = self.clock.now()
            try:
                batch = next(batches)
            except StopIteration:
                self.inflight.fetch_t0 = None
                return
            self.inflight.fetch_t0 = None
            self._record_fetch(t0, self.clock.now())
            yield batch

    @guarded()
    def _record_fetch(self, t0: int, t1: int) -> None:
        self.record_span_interval("data", t0, t1, source="iterate")
        self.parts.fetch_t0 = t0

    def span(
        self, phase: str, mb: int | None = None, stage: int | None = None, chunk: int | None = None
    ) -> SpanContext | NullContext:
        """A phase of the step (`fwd`, `bwd`, `opt`, `data`, ...; micro-batch `mb`, pipeline
        `stage` and `chunk` where they apply), as a context manager. Put the whole call in
        it: `with rec.span("fwd"): loss = model(batch)` covers the model's forward pre-hooks
        and forward hooks too (input processing there is forward time); time in no span is
        read as the rank's host time (data loading, logging)."""
        if phase not in _PHASES:
            report_once("Recorder.span", ValueError(f"unknown phase {phase!r}"))
        return SpanContext(self, phase, mb, stage, chunk)

    @guarded()
    def record_span_interval(self, phase: str, t0: int, t1: int, **fields: Any) -> None:
        """A span measured elsewhere (e.g. the DDP hook's wait interval)."""
        self.inflight.progress_ns = max(self.inflight.progress_ns, t1)
        self.parts.writer.write(
            {
                "kind": "span",
                "step": self.step_index,
                "phase": phase,
                "mb": None,
                "stage": None,
                "chunk": None,
                "t0": t0,
                "t1": t1,
                **fields,
            }
        )

    def on_step_end(self, callback: Callable[[], None]) -> None:
        self.parts.step_end_callbacks.append(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the recorder closes, before its files are (e.g. to unpatch)."""
        self._close_callbacks.append(callback)

    # ----------------------------------------------------------------- collectives
    def trace_collectives(self, before_launch: Callable[[CommEvent], None] | None = None) -> None:
        """Record every torch.distributed collective this process issues from now on."""
        if self._tracer is None:
            self._tracer = CollectiveTracer(
                self.record_comm_event, self._record_wait, self.clock.now, before_launch,
                on_issue=self.comm_issued,
            )  # fmt: skip
            self._tracer.install()

    def tagged(self, tag: str | None, expected_bytes: int | None = None) -> TagContext:
        """Traced collectives inside this context carry `tag` and `expected_bytes`."""
        return TagContext(tag, expected_bytes)

    def collective(
        self,
        op: str,
        nbytes: int,
        group: Any = None,
        *,
        dtype: str | None = None,
        expected_bytes: int | None = None,
        tag: str | None = None,
        peer: int | None = None,
        **fields: Any,
    ) -> CollectiveContext | NullContext:
        """Time a blocking collective by hand: `with rec.collective("all_reduce", n, tp_pg):`.

        `peer`: the other rank (global) of a send or recv. Extra keyword `fields` (e.g.
        `layer=3`) are written into the comm record as they are.
        """
        event = CommEvent(
            op=op, group=group, bytes=nbytes, dtype=dtype, t0=0, t1=0, is_async=False,
            blocking=True, expected_bytes=expected_bytes, tag=tag, fields=fields or None,
            peer=peer,
        )  # fmt: skip
        return CollectiveContext(self, event)

    @guarded()
    def comm_issued(self, e: CommEvent) -> None:
        """A collective issued (called before it is launched): it gets its `seq` and stays in
        the in-flight state until `record_comm_event` records it completed."""
        fields = self.groups.issued_fields(e)
        self.inflight.comms[id(e)] = (self.step_index, e, fields)
        self.inflight.progress_ns = max(self.inflight.progress_ns, e.t0)

    @guarded()
    def record_comm_event(self, e: CommEvent) -> None:
        record = self.groups.comm_record(e, self.step_index)
        self.inflight.comms.pop(id(e), None)
        self.inflight.progress_ns = max(self.inflight.progress_ns, e.t1)
        self.parts.writer.write(record)

    def _record_wait(self, t0: int, t1: int) -> None:
        self.record_span_interval("comm_wait", t0, t1, source="work_wait")

    # ----------------------------------------------------------------- memory, experts, events
    @guarded()
    def set_comm_buffer(self, name: str, nbytes: int) -> None:
        """Declare (or update) a communication buffer the trainer holds, in bytes."""
        self._comm_buffers[name] = int(nbytes)

    @guarded()
    def check_memory_budget(self, memory: dict[str, Any]) -> None:
        """An `oom_risk` event with the breakdown when the six categories exceed the budget.

        The sum counts a null category (not measurable here, or activations on a step they are
        not measured) as 0. Called once per step, with the step's memory record.
        """
        budget = self.memory_budget_bytes
        if not budget:
            return
        total = sum(memory.get(category) or 0 for category in MEMORY_CATEGORIES)
        if total > budget:
            self.event("oom_risk", budget_bytes=int(budget), total_bytes=int(total), **memory)

    def memory_breakdown(self) -> dict[str, Any]:
        return memory_breakdown(
            self.parts.params,
            self.optimizer,
            self.parts.activations if self.parts.measuring_activations else None,
            self._comm_buffers,
            self.device,
        )

    @guarded()
    def experts(
        self,
        layer: int,
        tokens: list[int],
        dropped: int | None = None,
        capacity: int | None = None,
        aux_loss: float | None = None,
    ) -> None:
        self.parts.writer.write(
            {
                "kind": "experts",
                "step": self.step_index,
                "layer": layer,
                "tokens": [int(t) for t in tokens],
                "dropped": dropped,
                "capacity": capacity,
                "aux_loss": aux_loss,
            }
        )

    @guarded()
    def event(self, name: str, **fields: Any) -> None:
        self.parts.writer.write({"kind": "event", "step": self.step_index, "name": name, **fields})
