"""The attribution on data shaped elsewhere: pipeline messages paired by peers and order (never
by tag names), and metamorphic properties of the verdict (the main finding, its ranks and its
cost do not change when tags are renamed or dropped, clocks shifted, optional fields dropped,
or the rank files converted). Ground truth from the simulator."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.api import analyze_path, load_any
from diag.contract.peers import pipeline_peers
from diag.contract.schema import Layout
from diag.rankfile.convert import convert_run
from diag.whatif.matching import message_peers
from simulator.cli import simulate as simulate_command
from simulator.injections import Faults

COST_TOLERANCE = 0.02
"""Relative: a clock shift rounds times through floats (256 ns at absolute clocks)."""
EXAMPLES = 6
"""Hypothesis examples per property (each analyses a 16-rank run, about a second)."""


def simulate(out: Path, *args: str) -> Path:
    command = [sys.executable, "-m", "diag", "simulate", "--out", str(out), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate(tmp_path_factory.mktemp("sim") / "run", "--ranks", "8", "--layout",
                    "dp=2,pp=4", "--steps", "2", "--microbatches", "8", "--schedule",
                    "interleaved", "--virtual-stages", "2", "--tags", "megatron")  # fmt: skip


def test_interleaved_messages_find_their_peers_without_tags(interleaved: Path) -> None:
    """Every send and receive of an interleaved 4-stage pipeline (each rank talks to both
    neighbours, the last stage to the first) gets its true peer from times alone: the
    simulator's truth is its own direction, kept here only in Megatron's names."""
    run = load_any(interleaved)
    comms = run.comms.reset_index(drop=True)
    rows, peer = message_peers(comms.assign(tag=None), run.manifest)
    ring = pipeline_peers(run.manifest)
    part = comms.iloc[rows]
    forward = part["tag"].astype(str).str.startswith("forward").to_numpy()
    send = (part["op"].astype(str) == "send").to_numpy()
    truth = [ring[r][1] if f == s else ring[r][0]
             for r, f, s in zip(part["rank"], forward, send, strict=True)]  # fmt: skip
    assert len(rows) > 500
    assert np.array_equal(peer, truth)


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate(tmp_path_factory.mktemp("sim") / "run", "--ranks", "16", "--layout",
                    "dp=2,tp=2,pp=4", "--steps", "4", "--microbatches", "8", "--inject",
                    "straggler:rank=9,ms=15", "--format", "jsonl")  # fmt: skip


def _verdict(report: dict[str, Any]) -> tuple[str, list[int], float]:
    main = report["findings"][0]
    return main["rule"], main["ranks"], main["cost_s"]


def _rewritten(run: Path, into: Path, change, reorder_seed: int | None = None) -> Path:
    """The run copied with each record changed; with a seed, each rank file's records within
    each step in a random order (the file's opening record, without a step, stays first)."""
    shutil.copytree(run, into)
    rng = np.random.default_rng(reorder_seed)
    for path in sorted(into.glob("rank-*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        if reorder_seed is not None:
            shuffled = [records[i] for i in rng.permutation(len(records))]
            records = sorted(shuffled, key=lambda r: -1 if r.get("step") is None else r["step"])
        path.write_text("".join(json.dumps(change(r)) + "\n" for r in records))
    return into


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    tags=st.sampled_from(["renamed", "dropped", "kept"]),
    shift_ns=st.integers(min_value=-(10**15), max_value=10**15),
    drop_bytes=st.booleans(),
    reorder_seed=st.none() | st.integers(min_value=0, max_value=2**32 - 1),
)
def test_the_verdict_does_not_depend_on_names_clocks_order_or_optional_fields(
    straggler_run: Path, tmp_path_factory: pytest.TempPathFactory, tags: str, shift_ns: int,
    drop_bytes: bool, reorder_seed: int | None,
) -> None:  # fmt: skip
    expected = _verdict(analyze_path(straggler_run))
    assert expected[1] == [9]
    names: dict[str, str] = {}

    def change(record: dict[str, Any]) -> dict[str, Any]:
        out = dict(record)
        for key in ("t0", "t1"):
            if isinstance(out.get(key), int):
                out[key] += shift_ns
        if out.get("kind") == "comm":
            if tags == "dropped":
                out["tag"] = None
            elif tags == "renamed" and out.get("tag") is not None:
                out["tag"] = names.setdefault(str(out["tag"]), f"t{len(names)}-{out['op']}")
            if drop_bytes:
                out["bytes"], out["expected_bytes"] = None, None
        return out

    changed = _rewritten(straggler_run, tmp_path_factory.mktemp("changed") / "run", change,
                         reorder_seed)  # fmt: skip
    rule, ranks, cost_s = _verdict(analyze_path(changed))
    assert (rule, ranks) == expected[:2]
    assert cost_s == pytest.approx(expected[2], rel=COST_TOLERANCE)


def test_the_verdict_survives_conversion_and_megatron_names(
    straggler_run: Path, tmp_path: Path
) -> None:
    expected = _verdict(analyze_path(straggler_run))
    arrow = tmp_path / "arrow"
    shutil.copytree(straggler_run, arrow)
    convert_run(arrow, "arrow")
    assert list(arrow.glob("rank-*.arrows"))
    rule, ranks, cost_s = _verdict(analyze_path(arrow))
    assert (rule, ranks) == expected[:2]
    assert cost_s == pytest.approx(expected[2], rel=COST_TOLERANCE)
    megatron = simulate(tmp_path / "megatron", "--ranks", "16", "--layout", "dp=2,tp=2,pp=4",
                        "--steps", "4", "--microbatches", "8", "--inject",
                        "straggler:rank=9,ms=15", "--tags", "megatron")  # fmt: skip
    tags = {str(t) for t in load_any(megatron).comms["tag"].dropna().unique()}
    assert tags == {"forward-send", "forward-recv", "backward-send", "backward-recv"}
    rule, ranks, cost_s = _verdict(analyze_path(megatron))
    assert (rule, ranks) == expected[:2]
    assert cost_s == pytest.approx(expected[2], rel=COST_TOLERANCE)


KINETO_COST_TOLERANCE = 0.20
"""Relative, for the run written as profiler traces (the ground-truth bar): a GPU trace has no
step boundaries of its own (a step runs from its first kernel to its last) and no phases, and
the replay reads waits from the device's idle time, so its local times differ from the
records' (this straggler: 17% below the run directory's cost; at m = 16, 8%)."""


def test_the_verdict_survives_being_written_as_profiler_traces(
    straggler_run: Path, tmp_path: Path
) -> None:
    """The same job as a GPU job's profiler traces, read with its layout: the same main finding
    and ranks, its cost within KINETO_COST_TOLERANCE."""
    expected = _verdict(analyze_path(straggler_run))
    traces = simulate(tmp_path / "traces", "--ranks", "16", "--layout", "dp=2,tp=2,pp=4",
                      "--steps", "4", "--microbatches", "8", "--inject",
                      "straggler:rank=9,ms=15", "--format", "kineto")  # fmt: skip
    assert len(list(traces.glob("*.pt.trace.json"))) == 16
    assert not (traces / "manifest.json").exists()
    report = analyze_path(traces, layout=Layout(dp=2, tp=2, pp=4, microbatches=8))
    assert report["run"]["trainer"] == "kineto"
    rule, ranks, cost_s = _verdict(report)
    assert (rule, ranks) == expected[:2]
    assert cost_s == pytest.approx(expected[2], rel=KINETO_COST_TOLERANCE)
    assert {str(g) for g in load_any(traces, layout=LAYOUT).comms["group"].unique()} == {
        "dp",
        "tp",
        "pp",
    }  # the groups named by their members' axis, not by the trace's `mesh_*` names


GROUND_TRUTH_LAYOUT = ["--ranks", "16", "--layout", "dp=2,tp=2,pp=4", "--steps", "5",
                       "--microbatches", "16"]  # fmt: skip
"""m = 4p: the schedule's own bubble is no finding, so the injected fault can be first."""
RECOVERED_WITHIN = 0.20
"""The issue's bar: the injected cost recovered within 20%."""
FAULTS = {  # injection: the ranks the main finding must name
    "straggler:rank=9,ms=15": [9],
    "stage-slow:stage=1,ms=5": [2, 3, 10, 11],
}
SHAPES = {"ours": [], "megatron": ["--tags", "megatron"], "untraced-dp": ["--untraced", "dp"],
          "kineto": ["--format", "kineto"]}  # fmt: skip
"""How the run is written: our records, Megatron's names, a group left unrecorded, or no run
directory at all but a GPU job's profiler traces (read with the layout, as a user would)."""
LAYOUT = Layout(dp=2, tp=2, pp=4, microbatches=16)


def analyze_shape(path: Path, shape: str) -> dict[str, Any]:
    return analyze_path(path, layout=LAYOUT if shape == "kineto" else None)


@pytest.fixture(scope="module")
def healthy_step_s(tmp_path_factory: pytest.TempPathFactory) -> float:
    run = simulate(tmp_path_factory.mktemp("sim") / "run", *GROUND_TRUTH_LAYOUT)
    return float(analyze_path(run)["attribution"]["measured_step_s"])


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_is_named_first_at_its_cost_in_every_shape(
    fault: str, shape: str, healthy_step_s: float, tmp_path: Path
) -> None:
    """Ground truth: what the injection adds to the simulated step. Recovered the same with
    our tags, Megatron's, or the dp group's collectives not recorded at all (its waits become
    time in no record, the synchronisations inferred from ranks resuming together)."""
    run = simulate(tmp_path / "run", *GROUND_TRUTH_LAYOUT, "--inject", fault, *SHAPES[shape])
    report = analyze_shape(run, shape)
    main = report["findings"][0]
    assert main["ranks"] == FAULTS[fault], (main["rule"], main["title"])
    injected_s = report["attribution"]["measured_step_s"] - healthy_step_s
    assert main["cost_s"] == pytest.approx(injected_s, rel=RECOVERED_WITHIN)
    if shape == "untraced-dp":
        assert "dp" not in set(load_any(run).comms["group"].astype(str))
        assert any("inferred" in note for note in report["attribution"]["notes"])


JITTER = "jitter:ms=60"
"""Uniform [0, 60] ms once a step on every rank: what balancing recovers of it (about 50 ms)
outweighs the healthy run's own stage imbalance (about 40 ms), so it can be first."""


@pytest.fixture(scope="module")
def balanced_jitter_step_s(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The jitter run with each step's draws replaced by their mean over each stage's ranks:
    the ground truth of what balancing saves (the simulator's own draws, averaged)."""
    stage_of_rank = (np.arange(16) // LAYOUT.tp) % LAYOUT.pp  # the grid: (dp, pp, tp)
    drawn = Faults.jitter_ns

    def balanced(faults: Faults, step: int) -> np.ndarray | None:
        draws = drawn(faults, step)
        return None if draws is None else pd.Series(draws).groupby(stage_of_rank).transform(
            "mean").to_numpy()  # fmt: skip

    out = tmp_path_factory.mktemp("balanced") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Faults, "jitter_ns", balanced)
        simulate_command.main([*GROUND_TRUTH_LAYOUT, "--inject", JITTER, "--out", str(out)],
                              standalone_mode=False)  # fmt: skip
    return float(analyze_path(out)["attribution"]["measured_step_s"])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_jitter_is_named_first_at_what_balancing_saves_in_every_shape(
    shape: str, balanced_jitter_step_s: float, tmp_path: Path
) -> None:
    """Random per-step delays on every rank: the random imbalance (BAL004, no rank) is the main
    finding in every shape, at what balancing the draws saves within 20%."""
    run = simulate(tmp_path / "run", *GROUND_TRUTH_LAYOUT, "--inject", JITTER, *SHAPES[shape])
    report = analyze_shape(run, shape)
    main = report["findings"][0]
    assert (main["rule"], main["ranks"]) == ("BAL004", []), main["title"]
    saved_s = report["attribution"]["measured_step_s"] - balanced_jitter_step_s
    assert main["cost_s"] == pytest.approx(saved_s, rel=RECOVERED_WITHIN)
