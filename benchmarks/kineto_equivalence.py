"""The same simulated job read as a run directory and as a GPU job's profiler traces, in each
trace shape `diag simulate --format kineto --trace-shape` writes (issue 39, "Done when"): the
trace folder must give the run directory's main finding (rule and ranks), its cost within 20%,
its bubble within 5 points, and the layout right. Where the shape did not trace the rank the
run directory names (a straggler on the second rank of a TP group, one rank per TP group
traced), the folder's finding is the waiting for it (BAL006, UNTRACED_TWIN) on the untraced
members of its TP group: which of them was late, the traces cannot say.

    .venv/bin/python benchmarks/kineto_equivalence.py [--ranks 16 256] [--shapes ...]

Prints one line per (layout, schedule, fault, shape) and exits 1 when one misses.
tests/unit/test_kineto_equivalence.py runs the small cases of the same matrix.

Every folder is read as a user reads it: with nothing given where the traces say the job's
axes (dp, tp, pp, ep, cp), the micro-batches per step (m) and the virtual stages (v, read
from the pipeline's sends and receives per step: diag/read/kineto/schedule.py). An older
trace without process groups gives its axes through what its ranks do
(diag/read/kineto/grid_placement.py). Only what the traces cannot say is given (a layout read
`unknown` or wrong: its axes are given, as `--layout dp=..,tp=..,pp=..` would, never m or v); the
`given` column says what was, the `m, v` column what the reader took (`read`) or that it
could not (`unknown`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag.api import analyze_path, load_any
from diag.contract.schema import Layout

COST_WITHIN = 0.20
"""Relative: the trace folder's main cost against the run directory's."""
BUBBLE_RULE = "PIP002"
"""Too few micro-batches: where the run directory names it (main or not), the trace folder
must too, its cost within COST_WITHIN (it needs m and v, read from the traces)."""
BUBBLE_WITHIN = 0.05
"""Absolute (5 points): the trace folder's measured bubble against the run directory's."""
SHAPES = {
    "devicemesh": ["--trace-shape", "devicemesh"],
    "megatron": ["--trace-shape", "megatron"],
    "old": ["--trace-shape", "old"],
    "one-per-tp": ["--trace-shape", "devicemesh", "--traced-ranks", "one-per-tp"],
    "old-one-per-tp": ["--trace-shape", "old", "--traced-ranks", "one-per-tp"],
}
"""The trace shapes compared with the run directory (host-bound has no run-directory twin)."""


@dataclass(frozen=True)
class Case:
    """One job of the matrix: its layout, schedule and injected fault."""

    dp: int
    tp: int
    pp: int
    microbatches: int
    schedule: str  # 1f1b | interleaved
    fault: str  # straggler | straggler-untraced | slow-stage | bubble | jitter
    steps: int = 4

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def virtual(self) -> int:
        return 2 if self.schedule == "interleaved" else 1

    @property
    def m(self) -> int:
        """Micro-batches: as many as stages for the bubble (too few), else `microbatches`."""
        return self.pp if self.fault == "bubble" else self.microbatches

    @property
    def layout(self) -> Layout:
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, microbatches=self.m,
                      virtual_stages=self.virtual)  # fmt: skip

    def straggler(self) -> int:
        """A rank of a middle stage, first in its TP group (traced in every shape); for
        `straggler-untraced`, the second of that group (not traced with one rank per TP
        group: its partner stands for it)."""
        first = ((self.dp - 1) * self.pp + 1) * self.tp
        return first + 1 if self.fault == "straggler-untraced" else first

    def inject(self) -> list[str]:
        return {
            "straggler": ["--inject", f"straggler:rank={self.straggler()},ms=15"],
            "straggler-untraced": ["--inject", f"straggler:rank={self.straggler()},ms=15"],
            "slow-stage": ["--inject", "stage-slow:stage=1,ms=10"],
            "bubble": [],
            "jitter": ["--inject", "jitter:ms=60"],
        }[self.fault]

    def args(self) -> list[str]:
        layers = max(8, self.pp * self.virtual)  # each model stage holds a layer at least
        return ["--ranks", str(self.ranks), "--layout", f"dp={self.dp},tp={self.tp},pp={self.pp}",
                "--layers", str(layers), "--microbatches", str(self.m), "--steps", str(self.steps),
                "--schedule", self.schedule, "--virtual-stages", str(self.virtual),
                *self.inject()]  # fmt: skip

    def name(self) -> str:
        return f"dp{self.dp}xtp{self.tp}xpp{self.pp} {self.schedule} {self.fault}"


def matrix(ranks: int) -> list[Case]:
    """The issue's matrix: at 16 ranks dp2 x pp4 (8 ranks) and dp2 x tp2 x pp4; at 256,
    dp32 x pp8 and dp4 x tp8 x pp8."""
    if ranks <= 16:
        layouts = [(2, 1, 4, 16), (2, 2, 4, 16)]  # dp x pp at 8 ranks, dp x tp x pp at 16
    else:
        layouts = [(ranks // 8, 1, 8, 16), (ranks // 64, 8, 8, 16)]
    faults = ("straggler", "straggler-untraced", "slow-stage", "bubble", "jitter")
    return [Case(dp, tp, pp, m, schedule, fault)
            for dp, tp, pp, m in layouts for schedule in ("1f1b", "interleaved")
            for fault in faults
            if fault != "straggler-untraced" or tp > 1]  # fmt: skip


def simulate(out: Path, args: list[str]) -> Path:
    command = [sys.executable, "-m", "diag", "simulate", "--out", str(out), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1])
    return out


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    main = report["findings"][0] if report["findings"] else {}
    bubble = next((f for f in report["findings"] if f.get("rule") == BUBBLE_RULE), None)
    return {
        "bubble_rule_cost_s": None if bubble is None else bubble.get("cost_s"),
        "rule": main.get("rule"),
        "ranks": main.get("ranks"),
        "cost_s": main.get("cost_s"),
        "bubble": report["summary"].get("bubble_fraction"),
        "layout": report["run"].get("layout"),
    }


def read_traces(folder: Path, truth: Layout) -> tuple[dict[str, Any], str, str]:
    """The report of a trace folder read as a user reads it, what was given and how m and v
    were taken: nothing is given where the reader derives the true dp, tp, pp, ep and cp from
    the traces; else (an older trace's unknown layout) those axes are, as `--layout
    dp=..,tp=..,pp=..` gives them, never m or v (`read_schedule` reads them or says unknown)."""
    manifest = load_any(folder).manifest
    layout: Layout | None = None
    if _axes(manifest.layout) != _axes(truth):
        layout = Layout(dp=truth.dp, tp=truth.tp, pp=truth.pp, ep=truth.ep, cp=truth.cp,
                        microbatches=0, virtual_stages=0)  # fmt: skip
        manifest = load_any(folder, layout=layout).manifest
    given = "-" if layout is None else "dp,tp,pp"
    return analyze_path(folder, layout=layout), given, read_schedule(manifest, truth)


def read_schedule(manifest: Any, truth: Layout) -> str:
    """`m, v read` where the reader took the truth's micro-batches and virtual stages from the
    traces, `unknown` where it could not, `wrong: m=.., v=..` where it took others."""
    if not manifest.schedule_known:
        return "unknown"
    got = (manifest.layout.microbatches, manifest.layout.virtual_stages)
    if got != (truth.microbatches, truth.virtual_stages):
        return f"wrong: m={got[0]}, v={got[1]}"
    return f"m={got[0]}, v={got[1]} read"


def _axes(layout: Layout) -> tuple[int, ...]:
    return (layout.dp, layout.tp, layout.pp, layout.ep, layout.cp)


UNTRACED_TWIN = {"BAL001": "BAL006", "BAL005": "BAL006"}
"""A rank's own finding in the run directory, and what a trace folder without that rank's
trace says of it: the waiting for it, of the ranks that were traced (BAL006, the same rank)."""


def misses(expected: dict[str, Any], got: dict[str, Any], untraced_tp: int = 0) -> list[str]:
    """What the trace folder's verdict gets wrong against the run directory's. `untraced_tp`:
    the TP size where the ranks the run directory names left no trace (one rank per TP group
    traced): the folder's finding is then their twin rule on the untraced members of their
    TP groups (which of them was late, no record says)."""
    out = []
    rule, ranks = expected["rule"], expected["ranks"]
    if untraced_tp:
        rule = UNTRACED_TWIN.get(rule, rule)
        tp = untraced_tp
        ranks = sorted({r // tp * tp + i for r in ranks for i in range(1, tp)})
    if (got["rule"], got["ranks"]) != (rule, ranks):
        out.append(f"finding {got['rule']} {got['ranks']} != {expected['rule']} "
                   f"{expected['ranks']}")  # fmt: skip
    want, cost = expected["cost_s"], got["cost_s"]
    if want and (cost is None or abs(cost - want) > COST_WITHIN * abs(want)):
        out.append(f"cost {cost} vs {want}")
    if expected["bubble_rule_cost_s"] is not None:  # the bubble's finding, main or not
        want, cost = expected["bubble_rule_cost_s"], got["bubble_rule_cost_s"]
        if cost is None or abs(cost - want) > COST_WITHIN * abs(want):
            out.append(f"{BUBBLE_RULE} cost {cost} vs {want}")
    if expected["bubble"] is not None and (
        got["bubble"] is None or abs(got["bubble"] - expected["bubble"]) > BUBBLE_WITHIN
    ):
        out.append(f"bubble {got['bubble']} vs {expected['bubble']}")
    return out


def compare(case: Case, shape: str, work: Path, expected: dict[str, Any] | None = None) -> dict:
    """One row of the table: the run directory's verdict, the trace folder's, what misses."""
    if expected is None:
        expected = verdict(
            analyze_path(simulate(work / "run", [*case.args(), "--format", "arrow"]))
        )
    started = time.monotonic()
    traces = simulate(
        work / f"traces-{shape}", [*case.args(), "--format", "kineto", *SHAPES[shape]]
    )
    report, given, schedule = read_traces(traces, case.layout)
    got = verdict(report)
    shutil.rmtree(traces, ignore_errors=True)
    # every job of the matrix has a middle stage and an end stage traced: m and v are read
    wrong = [f"m, v {schedule}"] if schedule != f"m={case.m}, v={case.virtual} read" else []
    return {"case": case.name(), "shape": shape, "expected": expected, "got": got,
            "given": given, "schedule": schedule,
            "misses": misses(expected, got, case.tp * _untraced(case, shape, expected)) + wrong,
            "seconds": time.monotonic() - started}  # fmt: skip


def _untraced(case: Case, shape: str, expected: dict[str, Any]) -> bool:
    """Whether the shape leaves every rank the run directory names without a trace (one rank
    per TP group traced: the first of each)."""
    ranks = expected.get("ranks") or []
    return shape.endswith("one-per-tp") and bool(ranks) and all(r % case.tp for r in ranks)


def _cost(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _bubble(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}"


def _verdict(v: dict[str, Any]) -> str:
    text = f"{v['rule']} {v['ranks']}, {_cost(v['cost_s'])}, {_bubble(v['bubble'])}"
    if v["bubble_rule_cost_s"] is not None and v["rule"] != BUBBLE_RULE:
        text += f" ({BUBBLE_RULE} {_cost(v['bubble_rule_cost_s'])})"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--faults", nargs="+", default=None)
    parser.add_argument("--schedules", nargs="+", default=None)
    parser.add_argument("--layouts", nargs="+", default=None, choices=["dp-pp", "dp-tp-pp"])
    options = parser.parse_args(argv)
    failed = 0
    print(
        "| ranks | job | fault | shape | given | m, v | run dir: finding, cost ms, bubble % "
        "| traces: finding, cost ms, bubble % | ok |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for ranks in options.ranks:
        for case in matrix(ranks):
            if options.faults and case.fault not in options.faults:
                continue
            if options.schedules and case.schedule not in options.schedules:
                continue
            if options.layouts and ("dp-tp-pp" if case.tp > 1 else "dp-pp") not in options.layouts:
                continue
            with tempfile.TemporaryDirectory(prefix="kineto-eq-") as tmp:
                work = Path(tmp)
                run = simulate(work / "run", [*case.args(), "--format", "arrow"])
                expected = verdict(analyze_path(run))
                shutil.rmtree(run, ignore_errors=True)
                for shape in options.shapes:
                    if shape.endswith("one-per-tp") and case.tp == 1:
                        continue
                    try:
                        row = compare(case, shape, work, expected)
                    except RuntimeError as err:
                        print(f"| {case.ranks} | {case.name()} | {shape} | error: {err} |")
                        failed += 1
                        continue
                    e, g = row["expected"], row["got"]
                    ok = "yes" if not row["misses"] else "no: " + "; ".join(row["misses"])
                    failed += bool(row["misses"])
                    job = case.name().rsplit(" ", 1)[0]
                    print(f"| {case.ranks} | {job} | {case.fault} | {shape} "
                          f"| {row['given']} | {row['schedule']} | {_verdict(e)} "
                          f"| {_verdict(g)} | {ok} |",
                          flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
