"""Issue 41's reproduction: a slow data-parallel replica whose peers wait for it where nothing
recorded the wait (the job records only the end of its gradient synchronisation: a 0.1 ms
all-reduce of a one-member group, then a 0.1 ms blocking all-reduce). Simulates dp x pp4 with a
straggler computing 2.35x its peers, rewrites the records (simulator.reshape.hide_waits),
analyses them, and compares the straggler's cost with what simulating without it saves.

    python benchmarks/hidden_waits.py [--dp 4] [--steps 6]      # --dp 64: 256 ranks
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from diag.api import diagnose, load_any
from simulator import ModelSpec, SimConfig, simulate
from simulator.reshape import hide_waits

FWD_MS, BWD_MS = 3.6, 7.2
"""The simulated default model's forward and backward per micro-batch on one rank (ms)."""
SLOWDOWN = 2.35
"""How much longer the straggler computes than its peers."""


def straggler_spec(rank: int = 0) -> str:
    """The straggler injection that makes `rank` compute SLOWDOWN x its peers (the simulator
    adds it to each micro-batch's forward)."""
    return f"straggler:rank={rank},ms={(SLOWDOWN - 1) * (FWD_MS + BWD_MS):.2f}"


def config(dp: int, steps: int, inject: tuple[str, ...] = (), seed: int = 0) -> SimConfig:
    # no LM head: the last stage does its peers' work (1.0x), so blaming it is wrong
    return SimConfig(dp=dp, pp=4, microbatches=32, steps=steps, inject=inject, seed=seed,
                     gpus_per_node=8, model=ModelSpec(lm_head=False))  # fmt: skip


def measured(root: Path, dp: int, steps: int, seed: int = 0) -> dict[str, Any]:
    """The hidden-wait run's report, and the saving measured by simulating without the
    straggler (both runs rewritten alike)."""
    means = {}
    reports = {}
    for name, inject in (("straggler", (straggler_spec(),)), ("healthy", ())):
        out = root / name
        simulate(config(dp, steps, inject, seed), out, format="jsonl")
        hide_waits(out, "dp")
        _, report = diagnose(load_any(out))
        reports[name] = report
        means[name] = report["attribution"]["measured_step_s"]
    return {"report": reports["straggler"], "saving_s": means["straggler"] - means["healthy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        found = measured(Path(tmp), args.dp, args.steps)
        seconds = time.perf_counter() - started
    report = found["report"]
    first = report["findings"][0] if report["findings"] else None
    causes = [(c["kind"], c.get("ranks"), round(c["cost_s"], 4))
              for c in report["attribution"]["causes"][:4]]  # fmt: skip
    print(json.dumps({"ranks": 4 * args.dp, "measured_saving_s": round(found["saving_s"], 4),
                      "main_finding": first and (first["rule"], first["ranks"], first["title"]),
                      "causes": causes, "seconds": round(seconds, 1)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
