"""The attribution recovers what the `stage-slow`, `jitter` and `loader-stall` injections cost:
each simulated with and without the injection (the same 3D layout), the matching cause's cost
against the measured step-time difference, and the main finding.

The recovery compares the rise of the matching cause's cost (injected minus healthy, same kind
and ranks) with the rise of `attribution.measured_step_s`, within RECOVERY. Two recoveries are
known to fall short, by the attribution's own definitions (docs/simulator.md, "Injections"),
and are strict xfails that quote the numbers measured when they were written:

- `jitter`: the `imbalance` counterfactual levels each rank at its peers' median, so it
  recovers the step's slowest draw minus the median draw; the mean draw every rank pays (and
  in a pipeline, the previous stage's draw the next one inherits) stays in the step.
- `loader-stall`: the gap before the first replayed step is outside the replayed timeline, so
  the `host` cause recovers (n - 1) / n of the stall over n replayed steps (0.75 at 5 steps).

The main finding is the report's first; under `jitter` that is PIP002 (the bubble, whose
counterfactual with 4x the micro-batches also averages the draws out: 0.0062 s against BAL004's
0.0057 s), a strict xfail too; BAL004 is the first finding the healthy run does not raise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diag.analysis import diagnose, load_any

LAYOUT = ["--ranks", "8", "--layout", "dp=2,tp=2,pp=2", "--gpus-per-node", "4", "--steps", "5",
          "--microbatches", "4", "--layers", "4", "--hidden", "1024"]  # fmt: skip
"""dp 2 x pp 2 x tp 2 over two hosts: ranks 0, 1, 4, 5 are stage 0; stage 1 holds the LM head,
so the healthy run already has a `stage` cause (and PIP003) naming ranks 2, 3, 6, 7."""
RECOVERY = 0.10
"""The largest relative gap between a cause's cost and the step time its injection adds."""

CASES = {
    # spec: (cause kind, cause ranks, main finding, its ranks)
    "stage-slow:stage=0,ms=5": ("stage", [0, 1, 4, 5], "PIP003", [0, 1, 4, 5]),
    "jitter:ms=20": ("imbalance", [], "BAL004", []),
    "loader-stall:rank=3,ms=30": ("host", [3], "BAL005", [3]),
}
SHORT = {
    "jitter:ms=20": "imbalance recovers 0.0057 s of the 0.0334 s the jitter adds (17%)",
    "loader-stall:rank=3,ms=30": "host recovers 0.0218 s of the 0.0291 s the stall adds (75%)",
}
"""Recoveries that fall short by the attribution's definitions (see the module docstring)."""
NOT_FIRST = {"jitter:ms=20": "PIP002 (bubble, cost 0.0062 s) precedes BAL004 (0.0057 s)"}
"""Main findings that come second, after one the injection makes worse as well."""


def _marked(spec: str, reasons: dict[str, str]) -> Any:
    if spec not in reasons:
        return spec
    return pytest.param(spec, marks=pytest.mark.xfail(strict=True, reason=reasons[spec]))


def _simulate(out: Path, *inject: str) -> dict[str, Any]:
    args = [arg for spec in inject for arg in ("--inject", spec)]
    subprocess.run(
        [sys.executable, "-m", "diag", "simulate", *LAYOUT, *args, "--out", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    return diagnose(load_any(out))[1]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _simulate(tmp_path_factory.mktemp("healthy") / "run")


@pytest.fixture(scope="module")
def injected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("injected")
    return {spec: _simulate(root / spec.split(":")[0], spec) for spec in CASES}


def _cost_s(report: dict[str, Any], kind: str, ranks: list[int]) -> float:
    causes = report["attribution"]["causes"]
    return next((c["cost_s"] for c in causes if c["kind"] == kind and c["ranks"] == ranks), 0.0)


@pytest.mark.parametrize("spec", [_marked(spec, SHORT) for spec in CASES])
def test_the_matching_cause_costs_what_the_injection_adds(
    spec: str, healthy: dict[str, Any], injected: dict[str, dict[str, Any]]
) -> None:
    kind, ranks, _, _ = CASES[spec]
    report = injected[spec]
    added_s = report["attribution"]["measured_step_s"] - healthy["attribution"]["measured_step_s"]
    cost_s = _cost_s(report, kind, ranks) - _cost_s(healthy, kind, ranks)
    assert added_s > 0.01
    assert cost_s == pytest.approx(added_s, rel=RECOVERY), (spec, cost_s, added_s)


@pytest.mark.parametrize("spec", [_marked(spec, NOT_FIRST) for spec in CASES])
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
