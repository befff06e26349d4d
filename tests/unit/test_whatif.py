"""The what-if replay: it gives the measured step back, and its counterfactuals recover what
known injections cost (simulated runs, where the same run without the injection is the truth)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diag.api import diagnose, load_any

RUNS = Path(__file__).resolve().parents[1] / "data" / "golden-runs"
SIMULATED = ["--ranks", "8", "--layout", "dp=2,tp=2,pp=2", "--gpus-per-node", "4", "--steps",
             "5", "--microbatches", "4", "--layers", "4", "--hidden", "1024"]  # fmt: skip
MAX_REPLAY_ERROR = 0.05
RECOVERED_WITHIN = 0.10


def _simulate(out: Path, *inject: str) -> Path:
    injections = [arg for spec in inject for arg in ("--inject", spec)]
    subprocess.run(
        [sys.executable, "-m", "diag", "simulate", *SIMULATED, *injections, "--out", str(out)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("whatif")
    specs = {"healthy": (), "straggler": ("straggler:rank=3,ms=5",),
             "slow-tp": ("slow-comm:ms=2,group=tp",)}  # fmt: skip
    return {name: diagnose(load_any(_simulate(root / name, *spec)))[1]
            for name, spec in specs.items()}  # fmt: skip


@pytest.mark.parametrize("name", sorted(p.name for p in RUNS.iterdir() if p.is_dir()))
def test_the_replay_gives_every_trainer_its_measured_step(name: str, tmp_path: Path) -> None:
    folder = tmp_path / name
    shutil.copytree(RUNS / name, folder, ignore=shutil.ignore_patterns(".diag-cache"))
    _, report = diagnose(load_any(folder))
    assert report["attribution"]["replay_error"] <= MAX_REPLAY_ERROR
    assert report["summary"]["replay_error"] == report["attribution"]["replay_error"]


def test_the_replay_gives_simulated_runs_their_step(simulated: dict[str, dict]) -> None:
    for report in simulated.values():
        assert report["attribution"]["replay_error"] <= MAX_REPLAY_ERROR


def _lost_s(simulated: dict[str, dict], name: str) -> float:
    step = simulated[name]["attribution"]["measured_step_s"]
    return step - simulated["healthy"]["attribution"]["measured_step_s"]


def test_a_straggler_costs_what_removing_it_saves(simulated: dict[str, dict]) -> None:
    report = simulated["straggler"]
    (cause,) = [c for c in report["attribution"]["causes"] if c["kind"] == "straggler"]
    assert cause["ranks"] == [3]
    assert cause["cost_s"] == pytest.approx(_lost_s(simulated, "straggler"), rel=RECOVERED_WITHIN)
    main = report["findings"][0]
    assert (main["rule"], main["ranks"]) == ("BAL001", [3])
    assert main["cost_s"] == pytest.approx(cause["cost_s"])


def test_a_slow_tp_link_costs_what_the_tp_transfers_take(simulated: dict[str, dict]) -> None:
    report = simulated["slow-tp"]
    tp = report["attribution"]
    cost = next(c["cost_s"] for c in tp["causes"] if c["kind"] == "transfer" and c["group"] == "tp")
    healthy = next(c["cost_s"] for c in simulated["healthy"]["attribution"]["causes"]
                   if c["kind"] == "transfer" and c["group"] == "tp")  # fmt: skip
    assert cost - healthy == pytest.approx(_lost_s(simulated, "slow-tp"), rel=RECOVERED_WITHIN)
    assert report["findings"][0]["rule"] in ("COM001", "COM002")


def test_waiting_is_split_into_skew_and_transfer(simulated: dict[str, dict]) -> None:
    """The straggler's peers in its TP group wait for it (skew); it waits for nobody."""
    rows = {(r["rank"], r["group"]): r for r in simulated["straggler"]["attribution"]["waits"]}
    assert rows[(2, "tp")]["skew_s"] > 10 * rows[(3, "tp")]["skew_s"]
    ranks = {r["rank"]: r for r in simulated["straggler"]["ranks"]}
    assert ranks[2]["skew_s"] > ranks[3]["skew_s"]


@pytest.mark.parametrize("name", ["dp", "pp-interleaved", "zero3", "ep", "simulated-3d"])
def test_the_compiled_loops_give_what_the_python_loops_give(name: str, tmp_path: Path) -> None:
    """Large timelines run the replay and the scan of waits compiled by numba, small ones as Python
    (diag/numeric/compiled.py): the same code, so the same times to the bit, on runs with every kind
    of event (DDP launches and waits, pipeline receives, blocking collectives), the measured
    durations and a counterfactual's."""
    from diag.metrics.common import analysed_steps
    from diag.numeric import compiled
    from diag.whatif import timeline
    from diag.whatif.replay import Durations, replay

    if name == "simulated-3d":
        run = load_any(_simulate(tmp_path / name, "straggler:rank=3,ms=5"))
    else:
        shutil.copytree(RUNS / name, tmp_path / name, ignore=shutil.ignore_patterns(".diag-cache"))
        run = load_any(tmp_path / name)
    steps, _ = analysed_steps(run.steps, run.starts_at_warmup)
    events = timeline.build(run, steps)
    measured = Durations.measured(events)
    halved = Durations(measured.seg_ns / 2, measured.transfer_ns, measured.post_ns * 0)
    for durations in (measured, halved):
        plain = replay(events, durations, compiled=False)
        fast = replay(events, durations, compiled=True)
        assert plain.tobytes() == fast.tobytes()
    ev = events.events
    scan = (ev["kind"].to_numpy(dtype="int64"), ev["instance"].to_numpy(),
            ev["a_ns"].to_numpy(), ev["e_ns"].to_numpy(), ev["a_ns"].to_numpy() + 1,
            events.first.astype("int64"), timeline.WAIT_SLACK_NS,
            timeline.MIN_WAITING_GAP_NS)  # fmt: skip
    for plain_out, fast_out in zip(timeline._awaited_launches(*scan),
                                   compiled.compiled(timeline._awaited_launches)(*scan),
                                   strict=True):  # fmt: skip
        assert plain_out.tolist() == fast_out.tolist()


def test_a_blocked_replay_goes_on_alike_compiled_and_as_python() -> None:
    """Where no rank can go on (a collective whose other member was never matched, a blocking
    op of no collective), the replay completes the one met first with the members there, as
    Python over lists and compiled alike: rank 1's op (met at 5 ns) first, ending at its own
    transfer (7 ns; its END at 22), then rank 0's collective, ending at 10 + 3 ns."""
    import numpy as np

    from diag.numeric.compiled import compiled
    from diag.whatif.replay import END, START, SYNC, _looped, _replay

    i64, f64 = np.int64, np.float64
    inputs = (
        np.array([START, SYNC, END, START, SYNC, END], dtype=i64),  # kind
        np.zeros(6, dtype=f64),  # own
        np.array([-1, 0, -1, -1, -1, -1], dtype=i64),  # instance: rank 1's op is in none
        np.full(6, -1, dtype=i64),  # sender
        np.zeros(6, dtype=np.bool_),  # one_way
        np.zeros(6, dtype=np.bool_),  # from_start
        np.array([0, 10, 20, 0, 5, 20], dtype=f64),  # measured start
        np.array([0, 10, 10, 0, 5, 15], dtype=f64),  # local time before each
        np.array([0, 3, 0, 0, 2, 0], dtype=f64),  # transfer
        np.zeros(6, dtype=f64),  # post
        np.array([0, 3, 6], dtype=i64),  # first event of each rank
        np.array([0, 2], dtype=i64),  # instance 0: two members,
        np.array([1, 4], dtype=i64),  # rank 0's and rank 1's (which never arrives as one)
        np.zeros(7, dtype=i64),
        np.zeros(0, dtype=i64),
        np.zeros(0, dtype=np.bool_),
    )
    origin = np.zeros(2, dtype=f64)
    plain = _looped(_replay, *inputs, origin=origin)
    fast = _looped(compiled(_replay), *inputs, origin=origin)
    assert plain.tobytes() == fast.tobytes()
    assert plain.tolist() == [0.0, 13.0, 23.0, 0.0, 12.0, 22.0]


def test_a_manifest_of_empty_groups_matches_no_rank_to_a_group() -> None:
    """`groups: {"dp": [[]]}` (found by tests/unit/test_fuzz_readers.py): no member, so every
    record of that axis is in no group of the manifest's, not a crash."""
    import numpy as np

    from diag.contract.schema import Manifest
    from diag.whatif.matching import group_member_of

    manifest = Manifest(run_id="r", created="", world_size=2, groups={"dp": [[]], "pp": [[1], [0]]})
    codes = np.array([1, 1, 2, 2])
    ranks = np.array([0, 1, 0, 1])
    members = group_member_of(manifest, codes, ["", "dp", "pp"], ranks)
    assert members.tolist() == [0, 0, 1, 0]
