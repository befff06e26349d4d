"""PyTorch profiler (Kineto) trace folders read as runs: `load_trace_dir(path)` -> RunData.

A user's own job profiled with `torch.profiler` and `tensorboard_trace_handler` leaves one
`*.pt.trace.json[.gz]` per rank; `diag analyze TRACE_DIR/` reads them like a run directory.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from diag import schema
from diag.kineto.convert import scan, to_records
from diag.kineto.files import TraceFile, is_trace_dir, load_files
from diag.kineto.kernels import KernelPatterns
from diag.load import RunData, run_from_records

__all__ = ["KernelPatterns", "is_trace_dir", "load_trace_dir"]


def load_trace_dir(
    path: str | Path,
    patterns: KernelPatterns | None = None,
    layout: schema.Layout | None = None,
) -> RunData:
    """Load a folder of Kineto traces; raises InputError (one line) when it is unusable."""
    folder = Path(path)
    skipped: list[str] = []
    traces = load_files(folder, skipped)
    patterns = patterns or KernelPatterns()
    records: dict[str, list[dict]] = {"step": [], "span": [], "comm": []}
    device_traces = 0
    for trace in traces:
        events = scan(trace.events)
        device_traces += bool(events.gpu_t0)
        for kind, rows in to_records(trace.rank, events, patterns).items():
            records[kind] += rows
        if not any(r["rank"] == trace.rank for r in records["step"]):
            skipped.append(f"{trace.path}: no events with a time (rank {trace.rank} has no steps)")
    manifest = _manifest(folder, traces, layout, device_traces > 0)
    missing = manifest.world_size - len(traces)
    if missing > 0:
        shown = ", ".join(str(t.rank) for t in traces[:8]) + (" ..." if len(traces) > 8 else "")
        skipped.append(
            f"{folder}: traces of {len(traces)} of {manifest.world_size} ranks ({shown}); "
            "the others are not analysed"
        )
    return run_from_records(manifest, folder, records, skipped)


def _manifest(
    folder: Path, traces: list[TraceFile], layout: schema.Layout | None, on_device: bool
) -> schema.Manifest:
    worlds = [t.world_size for t in traces if t.world_size]
    world_size = max([*worlds, max(t.rank for t in traces) + 1])
    backends = {t.backend for t in traces if t.backend}
    device = next((d.get("name") for t in traces for d in t.device_properties), None)
    return schema.Manifest(
        run_id=folder.resolve().name,
        created=_dt.datetime.fromtimestamp(folder.stat().st_mtime, _dt.UTC).isoformat(),
        world_size=world_size,
        trainer="kineto",
        command=None,
        backend=backends.pop() if len(backends) == 1 else None,
        device_type="cuda" if on_device else "cpu",
        layout=layout or schema.Layout(dp=world_size),
        ranks=[schema.RankInfo(rank=t.rank, device_name=device) for t in traces],
        status=schema.RunStatus.COMPLETE.value,
    )
