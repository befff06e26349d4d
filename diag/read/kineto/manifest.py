"""A trace folder's manifest: the one job of this module is to assemble, from the parsed
traces and their collectives, the `schema.Manifest` a run directory would carry (world size,
layout given or inferred with its schedule and ZeRO stage, groups, backend, device, status),
and the map from a group's ranks to its axis that names the collectives (`axis_of`)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, cast

from diag.contract import schema
from diag.contract.names import grid_groups
from diag.read.kineto import grid_placement
from diag.read.kineto.files import ParsedTrace
from diag.read.kineto.layout import GIVEN, FoundLayout, infer_layout
from diag.read.kineto.packed_comms import LayoutView, PackedComms
from diag.read.kineto.placement import grid_size
from diag.read.kineto.schedule import with_schedule
from diag.read.kineto.sharding import with_sharding


def folder_manifest(
    folder: Path,
    traces: list[ParsedTrace],
    layout: schema.Layout | None,
    records: dict[str, list[dict]],
    comm_parts: list[PackedComms],
    notes: list[str],
) -> schema.Manifest:
    """The folder's manifest; what was read from where the traces are silent is said in
    `notes` (the report's `skipped`)."""
    world_size = _world_size(folder, traces, comm_parts, notes)
    # the collectives as the inference counts them (packed_comms.LayoutView: exact)
    view = LayoutView([p.layout_rows for p in comm_parts])
    if layout is not None:
        # the groups a job on this grid forms: the pipeline's neighbours pair its messages
        grid = grid_size(layout) == world_size
        sizes = {"dp": layout.dp, "pp": layout.pp, "ep": layout.ep, "tp": layout.tp,
                 "cp": layout.cp}  # fmt: skip
        found = FoundLayout(layout, grid_groups(sizes) if grid else {}, GIVEN)
    else:
        configs = [group for t in traces for group in t.pg_groups]
        comms = cast(list[dict[str, Any]], view)
        found = infer_layout(world_size, configs, comms, records["step"])
        marks_of = {int(t.rank or 0): p.marks for t, p in zip(traces, comm_parts, strict=True)}
        found = grid_placement.refined(found, world_size, marks_of)
    # m and v: given, or from the pipeline's sends and receives per step (schedule.py)
    found = with_schedule(found, layout, view.rows, records["step"])
    # the ZeRO stage: given, or from the data-parallel collectives (sharding.py)
    found = with_sharding(found, layout, view.rows)
    backends = {t.backend for t in traces if t.backend}
    device = next((t.device_name for t in traces if t.device_name), None)
    on_device = any(t.on_device for t in traces)
    # the device: CUDA's (or ROCm's, through the same API), else the one whose categories
    # were read as CUDA's (an MTIA, an Intel GPU) where every trace that names one agrees
    others = {d for t in traces for d in t.other_devices}
    device_type = (others.pop() if len(others) == 1 else "cuda") if on_device else "cpu"
    return schema.Manifest(
        run_id=folder.resolve().name,
        created=_dt.datetime.fromtimestamp(_newest_mtime(traces), _dt.UTC).isoformat(),
        world_size=world_size,
        trainer="kineto",
        command=None,
        backend=backends.pop() if len(backends) == 1 else None,
        device_type=device_type,
        layout=found.layout,
        groups=found.groups,
        layout_source=found.source,
        ranks=[schema.RankInfo(rank=int(t.rank or 0), device_name=device) for t in traces],
        status=window_status(traces, records),
    )


def _world_size(
    folder: Path, traces: list[ParsedTrace], comm_parts: list[PackedComms], notes: list[str]
) -> int:
    """The job's number of ranks: as the traces' distributedInfo says; where none says it, at
    least every rank a collective's process group names or counts, not only the traced ranks
    (a trace without distributedInfo whose all-reduces span ranks 0-1 is one of two ranks, not
    a job of one), with a note saying where the number came from."""
    worlds = [t.world_size for t in traces if t.world_size]
    traced = max(int(t.rank or 0) for t in traces) + 1
    if worlds:
        return max(*worlds, traced)
    named = max((part.ranks_named for part in comm_parts), default=0)
    if named > traced:
        notes.append(f"{folder}: no trace gives the world size (distributedInfo.world_size); "
                     f"the process groups of its collectives show {named} ranks (their ranks "
                     "or sizes): read as a job of that many")  # fmt: skip
    return max(traced, named)


def window_status(traces: list[ParsedTrace], records: dict[str, list[dict]]) -> str:
    """`complete` where every traced rank's profiled window closed alike: each has steps and
    the same last one; else unknown (a rank whose trace stops steps before the others':
    it hung, died or was cut short, which the traces cannot tell apart). A trace folder says
    no more: not whether the job finished, only whether the window it profiled did (each
    kept step closed; a kernel launched outside every step is not read)."""
    last: dict[int, int] = {}
    for step in records["step"]:
        rank = int(step["rank"])
        last[rank] = max(last.get(rank, step["step"]), step["step"])
    if any(int(t.rank or 0) not in last for t in traces) or len(set(last.values())) > 1:
        return schema.RunStatus.UNKNOWN.value
    return schema.RunStatus.COMPLETE.value


def axis_of(manifest: schema.Manifest) -> dict[tuple[int, ...], str]:
    """Each manifest group's sorted ranks -> its axis (the first axis of equal ranks). A
    collective whose process group's ranks are one of these is named by that axis (`dp`,
    `tp`, ...; `packed_comms.named_by_axis`): the trace's own names (`mesh_dp`, `pg3`, or one
    description for many groups) say nothing the analysis may rely on, the members do. Others
    keep the trace's name."""
    axes: dict[tuple[int, ...], str] = {}
    for axis, groups in manifest.groups.items():
        for members in groups:
            axes.setdefault(tuple(sorted(members)), axis)
    return axes


def _newest_mtime(traces: list[ParsedTrace]) -> float:
    """When the newest trace was written: the run's date (the folder's own time changes when
    its cache is written)."""
    times = []
    for trace in traces:
        try:
            times.append(trace.path.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)
