"""What HTA (Holistic Trace Analysis) adds on a GPU trace folder, as plain JSON tables:
its temporal breakdown, idle-time breakdown, kernel-type breakdown and the critical path of one
iteration. `diag analyze TRACE_DIR --hta` puts them in the report under `hta`; the dashboard
shows them on the Overview.

HTA parses the folder again, slowly; it is asked only on request. Each analysis that fails is
reported with its one-line reason and the others go on. Where HTA is known to be wrong it is
said next to its numbers: it classifies by NCCL names only, so custom all-to-all kernels such
as DeepEP's count as computation in its breakdowns.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from diag.contract.limits import MAX_WHOLE_TRACE_BYTES
from diag.errors import InputError
from diag.read.kineto.kernels import DEFAULT_COMM_PATTERNS
from diag.read.kineto.stream import inflated
from diag.read.kineto.trace_folder import trace_files

HTA_BLIND_SPOT = (
    "HTA counts only NCCL kernels as communication: custom all-to-all kernels (DeepEP "
    "dispatch/combine/notify) are computation in its tables, communication in diag's"
)


def hta_analyses(folder: str | Path) -> dict[str, Any]:
    """HTA's tables for the folder (records), with `errors` naming what could not be run."""
    out: dict[str, Any] = {"errors": {}, "notes": []}
    accepted, out["notes"] = accepted_traces(Path(folder))
    if not accepted:
        out["errors"]["load"] = "no trace file diag accepted to hand to HTA"
        return out
    with tempfile.TemporaryDirectory(prefix="diag-hta-") as private:
        for path in accepted:  # a fresh private folder: HTA sees these files and no others
            os.symlink(path.resolve(), Path(private, path.name))
        try:
            analysis = _quietly(_trace_analysis, Path(private))
        except Exception as err:  # HTA raises plain exceptions on traces it cannot read
            out["errors"]["load"] = _one_line(err)
            return out
        return _tables(analysis, out)


def accepted_traces(folder: Path) -> tuple[list[Path], list[str]]:
    """The folder's trace files HTA may be handed, and a note for each left out: regular files
    that inflate within diag's bound on gzip (stream.inflated) and to at most
    MAX_WHOLE_TRACE_BYTES, since HTA reads each whole (its parser holds several times that)."""
    accepted, notes = [], []
    for path in trace_files(folder):
        try:
            inflated_bytes = 0
            for chunk in inflated(path):
                inflated_bytes += len(chunk)
                if inflated_bytes > MAX_WHOLE_TRACE_BYTES:
                    mib = MAX_WHOLE_TRACE_BYTES // 2**20
                    raise InputError(path, f"over {mib} MiB of text (HTA reads a trace whole)")
        except InputError as err:
            notes.append(f"{err}; not handed to HTA")
            continue
        accepted.append(path)
    return accepted, notes


def _tables(analysis: Any, out: dict[str, Any]) -> dict[str, Any]:
    """HTA's tables of a loaded analysis, added to `out`."""
    steps = _call(out, "profiler_steps", analysis.get_profiler_steps)
    tables = {
        "temporal_breakdown": lambda: analysis.get_temporal_breakdown(visualize=False),
        "idle_time_breakdown": lambda: analysis.get_idle_time_breakdown(visualize=False)[0],
        "kernel_type_breakdown": lambda: analysis.get_gpu_kernel_breakdown(visualize=False)[0],
        "comm_comp_overlap": lambda: analysis.get_comm_comp_overlap(visualize=False),
    }
    for name, run in tables.items():
        frame = _call(out, name, run)
        if isinstance(frame, pd.DataFrame):
            out[name] = frame.to_dict("records")
    if steps:
        out["critical_path"] = _call(out, "critical_path", lambda: _critical_path(analysis, steps))
    if _has_custom_comm_kernels(analysis):
        out["notes"].append(HTA_BLIND_SPOT)
    return out


def _trace_analysis(folder: Path) -> Any:
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis(trace_dir=str(folder))


def _critical_path(analysis: Any, steps: list[int]) -> dict[str, Any]:
    """The critical path of the middle profiled iteration on the first rank: the share of it
    bound by CPU, compute, communication, launch and kernel-kernel overhead."""
    rank = int(min(analysis.t.traces))
    step = int(steps[len(steps) // 2])
    graph, ok = _quietly(
        analysis.critical_path_analysis, rank=rank, annotation="ProfilerStep", instance_id=step
    )
    if not ok:
        raise RuntimeError(f"HTA could not build the critical path of step {step}")
    summary = graph.summary()
    return {"rank": rank, "step": step, "share": {str(k): float(v) for k, v in summary.items()}}


def _has_custom_comm_kernels(analysis: Any) -> bool:
    import re

    pattern = re.compile("|".join(p for p in DEFAULT_COMM_PATTERNS if "nccl" not in p))
    names = analysis.t.symbol_table.get_sym_table()
    return any(pattern.search(str(name)) for name in names)


def _call(out: dict[str, Any], name: str, fn: Any) -> Any:
    try:
        return _quietly(fn)
    except Exception as err:
        out["errors"][name] = _one_line(err)
        return None


def _quietly(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """HTA logs, prints and warns (pandas deprecations) freely; keep the terminal for diag's
    own report."""
    logging.getLogger("hta").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]
