"""A straggler read from GPU traces costs what it costs read from the run directory (issue 39).

DDP launches its buckets' all-reduces during backward; while a peer is late, the first bucket's
NCCL kernel spins until it arrives and the buckets launched after it queue behind it on the
group's stream, starting back to back when it ends. Read at their kernels' starts, those
collectives arrived late on the waiting rank too and, with no computation under them, read as
collectives it blocked in: the replay then kept the waiting rank's step when the straggler's
excess was removed (a 50 ms straggler cost 6.8 ms from the traces of a pure data-parallel job,
50.4 ms from its run directory; 140 against 199 ms in dp x pp). A queued kernel arrived at its
launch (diag/read/kineto/queued.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.kineto_equivalence import simulate
from diag.api import analyze_path, load_any
from diag.contract.schema import Layout

COST_WITHIN = 0.20
STRAGGLER = ["--inject", "straggler:rank=1,ms=50", "--steps", "4"]
JOBS = {
    "dp": (["--ranks", "2"], Layout(dp=2)),
    "dp-pp": (["--layout", "dp=2,pp=2", "-m", "4"], Layout(dp=2, pp=2, microbatches=4)),
}
"""Each job's `diag simulate` arguments and its layout. The pure data-parallel job's traces list
only the world's group, whose axis the placement of its ops does not settle while a peer waits
(placement.py): its layout is given, as `--layout dp=2` would."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per job, its run directory and its trace folder, of one simulated run each."""
    out = {}
    for name, (args, _) in JOBS.items():
        work = tmp_path_factory.mktemp(name)
        run = simulate(work / "run", [*args, *STRAGGLER, "--format", "arrow"])
        traces = simulate(work / "traces", [*args, *STRAGGLER, "--format", "kineto"])
        out[name] = (run, traces)
    return out


def _straggler(report: dict[str, Any]) -> tuple[list[int], float]:
    """The ranks and cost (s) of the report's BAL001 finding."""
    found = [f for f in report["findings"] if f["rule"] == "BAL001"]
    assert found, [f["rule"] for f in report["findings"]]
    return found[0]["ranks"], found[0]["cost_s"]


@pytest.mark.parametrize("job", list(JOBS))
def test_the_traces_give_the_run_directorys_straggler_and_cost(
    job: str, folders: dict[str, tuple[Path, Path]]
) -> None:
    run, traces = folders[job]
    ranks, cost = _straggler(analyze_path(run))
    traced_ranks, traced_cost = _straggler(analyze_path(traces, layout=JOBS[job][1]))
    assert ranks == traced_ranks == [1]
    assert abs(traced_cost - cost) <= COST_WITHIN * cost, (traced_cost, cost)


def test_a_queued_all_reduce_arrives_at_its_launch(folders: dict[str, tuple[Path, Path]]) -> None:
    """The waiting rank's buckets read as the run directory records them: launched during
    backward (asynchronous, at their launch) and not as collectives it blocked in, where the
    kernels queued behind the first one start at its end."""
    run, traces = folders["dp"]
    recorded = load_any(run).comms
    read = load_any(traces, layout=Layout(dp=2)).comms
    for comms in (recorded, read):  # every bucket of the waiting rank launched, none blocking
        assert comms.loc[comms["rank"] == 0, "async"].astype(bool).all()
    waiting = read[read["rank"] == 0].sort_values(["step", "t0"])
    mine = recorded[recorded["rank"] == 0].sort_values(["step", "t0"])
    # the steps' clocks differ (a trace's step starts at its first kernel): compare within steps
    starts = {}
    for name, comms, steps in ((("read", waiting, load_any(traces, layout=Layout(dp=2)).steps),
                                ("recorded", mine, load_any(run).steps))):  # fmt: skip
        first = steps[steps["rank"] == 0].set_index("step")["t0"]
        starts[name] = (comms["t0"] - comms["step"].map(first)).to_numpy(dtype=np.int64)
    assert len(starts["read"]) == len(starts["recorded"])
    assert np.abs(starts["read"] - starts["recorded"]).max() < 100_000  # 0.1 ms: launch latency
