"""Helpers shared by the tests that read a simulated job: a profiler-trace folder of a small
pipeline job (test_kineto_window, test_kineto_packed_spans), and the straggler jobs the
attribution's properties draw (test_ambiguous_gaps, test_hidden_waits)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import strategies as st

if TYPE_CHECKING:
    from simulator import SimConfig


def trace_folder(tmp_path_factory: pytest.TempPathFactory, name: str, steps: int) -> Path:
    """A Kineto trace folder of `steps` steps of a dp=2 x pp=2 job of 4 micro-batches, in a new
    temporary folder `name` (`diag simulate --format kineto`)."""
    from click.testing import CliRunner

    from diag.cli.main import main

    out = tmp_path_factory.mktemp(name) / "traces"
    result = CliRunner().invoke(main, [
        "simulate", "--layout", "dp=2,pp=2", "-m", "4", "--steps", str(steps), "--format",
        "kineto", "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


LAYOUTS = [(4, 1, 1), (2, 1, 2), (2, 2, 1), (4, 1, 2), (2, 2, 2)]
"""(dp, tp, pp) of the simulated jobs the properties draw from."""
STRAGGLER_DRAWS = {
    "layout": st.sampled_from(LAYOUTS),
    "where": st.integers(min_value=0, max_value=63),
    "ms": st.sampled_from([5.0, 10.0, 20.0]),
    "seed": st.integers(min_value=0, max_value=1000),
}
"""What a property draws (`@given(**STRAGGLER_DRAWS)`): a layout, the straggler's rank (modulo
the world), its extra time per step (ms) and the simulation's seed."""


def straggler_job(
    layout: tuple[int, int, int], seed: int, inject: tuple[str, ...] = ()
) -> SimConfig:
    """Five steps of a dp x tp x pp job of an 8-layer model (4 micro-batches where pipelined),
    with the faults `inject` (a straggler: `straggler:rank=R,ms=M`)."""
    from simulator import ModelSpec, SimConfig

    dp, tp, pp = layout
    model = ModelSpec(layers=8, hidden=1024, lm_head=False)
    microbatches = 4 if pp > 1 else 1
    return SimConfig(dp=dp, tp=tp, pp=pp, microbatches=microbatches, steps=5, seed=seed,
                     inject=inject, model=model)  # fmt: skip
