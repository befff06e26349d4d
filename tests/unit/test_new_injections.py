"""The attribution recovers what the `stage-slow`, `jitter` and `loader-stall` injections cost:
each simulated with and without the injection (the same 3D layout), the matching cause's cost
against what the simulator says removing the cause saves, and the main finding.

The recovery compares the rise of the matching cause's cost (injected minus healthy, same kind
and ranks) with the step time the cause adds, within RECOVERY:
- `stage-slow`, `loader-stall`: the rise of `attribution.measured_step_s` over the healthy run.
- `jitter`: the random per-rank draws are work as well as imbalance; balancing (data, sequence
  lengths) moves work between the ranks of a stage and deletes none, so what it can save is
  the injected run against the same run with each step's draws replaced by their mean over
  each stage's ranks (the simulator re-run with balanced draws: the ground truth of the
  `imbalance` counterfactual, docs/metrics.md "Attribution"). Its bound if the variation is
  noise (`if_noise_saves_s`: every piece of work at the quickest its stage did it) rises with
  what the injection adds to the step, within NOISE_RECOVERY.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from diag.api import diagnose, load_any
from simulator.cli import simulate
from simulator.injections import Faults

LAYOUT = ["--ranks", "8", "--layout", "dp=2,tp=2,pp=2", "--gpus-per-node", "4", "--steps", "5",
          "--microbatches", "4", "--layers", "4", "--hidden", "1024"]  # fmt: skip
"""dp 2 x pp 2 x tp 2 over two hosts: ranks 0, 1, 4, 5 are stage 0; stage 1 holds the LM head,
so the healthy run already has a `stage` cause (and PIP003) naming ranks 2, 3, 6, 7."""
RECOVERY = 0.10
"""The largest relative gap between a cause's cost and the step time its injection adds."""
NOISE_RECOVERY = 0.20
"""The same for the jitter's noise bound (the issue's bar; measured 12% below at 5 steps: the
quickest instance of a piece of work over a few steps still holds some jitter)."""

CASES = {
    # spec: (cause kind, cause ranks, main finding, its ranks)
    "stage-slow:stage=0,ms=5": ("stage", [0, 1, 4, 5], "PIP003", [0, 1, 4, 5]),
    "jitter:ms=20": ("imbalance", [], "BAL004", []),
    "loader-stall:rank=3,ms=30": ("host", [3], "BAL005", [3]),
}
JITTER = "jitter:ms=20"
STAGE_OF_RANK = (np.arange(8) // 2) % 2
"""The grid order of the layout: rank = (dp_i * pp + pp_i) * tp + tp_i."""


def _simulate(out: Path, *inject: str) -> dict[str, Any]:
    args = [arg for spec in inject for arg in ("--inject", spec)]
    subprocess.run(
        [sys.executable, "-m", "diag", "simulate", *LAYOUT, *args, "--out", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    return diagnose(load_any(out))[1]


def _simulate_balanced_jitter(out: Path, spec: str) -> dict[str, Any]:
    """The `jitter` run with each step's draws replaced by their mean over each stage's ranks
    (in-process: the simulator's own draws, averaged)."""
    drawn = Faults.jitter_ns

    def balanced(faults: Faults, step: int) -> np.ndarray | None:
        draws = drawn(faults, step)
        if draws is None:
            return None
        means = pd.Series(draws).groupby(STAGE_OF_RANK).transform("mean")
        return means.to_numpy()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Faults, "jitter_ns", balanced)
        simulate.main([*LAYOUT, "--inject", spec, "--out", str(out)], standalone_mode=False)
    return diagnose(load_any(out))[1]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _simulate(tmp_path_factory.mktemp("healthy") / "run")


@pytest.fixture(scope="module")
def injected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("injected")
    return {spec: _simulate(root / spec.split(":")[0], spec) for spec in CASES}


@pytest.fixture(scope="module")
def without_cause(
    healthy: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """Per injection, the run with its cause removed: the healthy run, or for `jitter` the
    balanced draws."""
    balanced = _simulate_balanced_jitter(tmp_path_factory.mktemp("balanced") / "run", JITTER)
    return {spec: balanced if spec == JITTER else healthy for spec in CASES}


def _cost_s(report: dict[str, Any], kind: str, ranks: list[int]) -> float:
    causes = report["attribution"]["causes"]
    return next((c["cost_s"] for c in causes if c["kind"] == kind and c["ranks"] == ranks), 0.0)


@pytest.mark.parametrize("spec", list(CASES))
def test_the_matching_cause_costs_what_removing_it_saves(
    spec: str,
    healthy: dict[str, Any],
    injected: dict[str, dict[str, Any]],
    without_cause: dict[str, dict[str, Any]],
) -> None:
    kind, ranks, _, _ = CASES[spec]
    report, removed = injected[spec], without_cause[spec]
    added_s = report["attribution"]["measured_step_s"] - removed["attribution"]["measured_step_s"]
    cost_s = _cost_s(report, kind, ranks) - _cost_s(healthy, kind, ranks)
    assert added_s > 0.01
    assert cost_s == pytest.approx(added_s, rel=RECOVERY), (spec, cost_s, added_s)


@pytest.mark.parametrize("spec", list(CASES))
def test_the_main_finding_names_the_injection(
    spec: str, injected: dict[str, dict[str, Any]]
) -> None:
    _, _, rule, ranks = CASES[spec]
    main = injected[spec]["findings"][0]
    assert (main["rule"], main["ranks"]) == (rule, ranks)


@pytest.mark.parametrize("spec", list(CASES))
def test_the_first_new_finding_names_the_injection(
    spec: str, healthy: dict[str, Any], injected: dict[str, dict[str, Any]]
) -> None:
    _, _, rule, ranks = CASES[spec]
    known = {(f["rule"], tuple(f["ranks"])) for f in healthy["findings"]}
    new = [f for f in injected[spec]["findings"] if (f["rule"], tuple(f["ranks"])) not in known]
    assert new and (new[0]["rule"], new[0]["ranks"]) == (rule, ranks)


def test_the_jitters_noise_bound_is_what_it_adds(
    healthy: dict[str, Any], injected: dict[str, dict[str, Any]]
) -> None:
    """The jitter sleeps: no work, so removing it saves what it adds, and the imbalance's bound
    if the variation is noise recovers that (the healthy run's own noise subtracted)."""

    def bound_s(report: dict[str, Any]) -> float:
        causes = [c for c in report["attribution"]["causes"] if c["kind"] == "imbalance"]
        return float(causes[0]["evidence"]["if_noise_saves_s"]) if causes else 0.0

    report = injected[JITTER]
    added_s = report["attribution"]["measured_step_s"] - healthy["attribution"]["measured_step_s"]
    rise_s = bound_s(report) - bound_s(healthy)
    assert rise_s == pytest.approx(added_s, rel=NOISE_RECOVERY), (rise_s, added_s)
