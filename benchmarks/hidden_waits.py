"""Issue 41's reproduction: a slow data-parallel replica whose peers wait for it where nothing
recorded the wait (the job records only the end of its gradient synchronisation: a 0.1 ms
all-reduce of a one-member group, then a 0.1 ms blocking all-reduce). Simulates dp x pp4 with a
straggler computing 2.35x its peers, rewrites the records (simulator.reshape.hide_waits),
analyses them, and compares the straggler's cost with what simulating without it saves.

    python benchmarks/hidden_waits.py [--dp 4] [--steps 6]      # --dp 64: 256 ranks
    python benchmarks/hidden_waits.py --resume-spread-ms 50     # the ranks resume apart

With `--resume-spread-ms` each rank resumes up to that long after the hidden wait ended, so that
the evidence no longer decides whether the gaps were waiting: the costs come as ranges
(`cost_range_s`), which should hold the measured saving.
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


def measured(
    root: Path, dp: int, steps: int, seed: int = 0, resume_spread_ms: float = 0.0
) -> dict[str, Any]:
    """The hidden-wait run's report, and the saving measured by simulating without the
    straggler (both runs rewritten alike, the ranks resuming up to `resume_spread_ms` apart)."""
    means = {}
    reports = {}
    for name, inject in (("straggler", (straggler_spec(),)), ("healthy", ())):
        out = root / name
        simulate(config(dp, steps, inject, seed), out, format="jsonl")
        hide_waits(out, "dp", resume_spread_ms=resume_spread_ms, seed=seed)
        _, report = diagnose(load_any(out))
        reports[name] = report
        means[name] = report["attribution"]["measured_step_s"]
    return {"report": reports["straggler"], "saving_s": means["straggler"] - means["healthy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--resume-spread-ms", type=float, default=0.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        found = measured(Path(tmp), args.dp, args.steps, resume_spread_ms=args.resume_spread_ms)
        seconds = time.perf_counter() - started
    report = found["report"]
    first = report["findings"][0] if report["findings"] else None
    causes = [(c["kind"], c.get("ranks"), round(c["cost_s"], 4),
               *([[round(x, 4) for x in c["cost_range_s"]]] if "cost_range_s" in c else []))
              for c in report["attribution"]["causes"][:4]]  # fmt: skip
    print(json.dumps({"ranks": 4 * args.dp, "measured_saving_s": round(found["saving_s"], 4),
                      "main_finding": first and (first["rule"], first["ranks"], first["title"],
                                                first.get("cost_s"), first.get("cost_range_s")),
                      "causes": causes, "seconds": round(seconds, 1)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
