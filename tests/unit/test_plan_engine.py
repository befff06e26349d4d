"""The plan's closed-form step time agrees with the simulator's event engine it is built from
(same costs, jitter off), so ranking by it ranks what `diag simulate` would run."""

from __future__ import annotations

import numpy as np
import pytest

from diag.plan import Cluster, Job, Layout
from diag.plan.timing import step_time
from simulator.config import ModelSpec, SimConfig
from simulator.engine import Engine
from simulator.hardware import HardwareSpec
from simulator.injections import parse_faults, stage_of_ranks

MODEL = ModelSpec(layers=8, hidden=4096, heads=32, seq_len=2048, vocab=50304, dtype="bf16")
CASES = [  # dp, tp, pp, m, v, gpus per node
    (2, 1, 1, 1, 1, 8),
    (4, 2, 1, 1, 1, 8),
    (1, 8, 1, 2, 1, 4),  # TP across two nodes
    (2, 2, 2, 4, 1, 8),
    (1, 1, 4, 8, 1, 8),
    (2, 1, 4, 8, 2, 8),
]


def _engine_step_s(config: SimConfig) -> float:
    faults = parse_faults((), config.world_size, 0, stages=stage_of_ranks(config), seed=0)
    engine = Engine(config, faults)
    end = engine._step(0, np.zeros(engine.grid.shape), [])
    return float(end.max()) / 1e9


@pytest.mark.parametrize(("dp", "tp", "pp", "m", "v", "per_node"), CASES)
def test_plan_step_matches_the_engine(
    dp: int, tp: int, pp: int, m: int, v: int, per_node: int
) -> None:
    hardware = HardwareSpec()
    config = SimConfig(
        dp=dp, tp=tp, pp=pp, microbatches=m, virtual_stages=v, model=MODEL,
        schedule="interleaved" if v > 1 else "1f1b", hardware=hardware, jitter=0.0,
        steps=1, gpus_per_node=per_node,
    )  # fmt: skip
    config.check()
    layout = Layout(dp=dp, tp=tp, pp=pp, microbatches=m, v=v, sequence_parallel=False)
    planned = step_time(
        Job(MODEL, dp * m, 1), layout, Cluster(config.world_size, per_node, hardware)
    )
    assert planned.step_s == pytest.approx(_engine_step_s(config), rel=0.06)
