"""`diag simulate`: the simulator reproduces the seed's physics, and the rules diagnose its runs
as they diagnose real ones (small worlds, a few steps each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diag.api import diagnose, load_any
from diag.cli.main import main
from diag.contract import ledger
from diag.contract.injections import jitter_ms, parse_injection
from diag.rankfile.convert import rank_records
from diag.read.load import load_run
from simulator import HardwareSpec, ModelSpec, SimConfig, SimulationError, simulate

SMALL = {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 2048, "vocab": 8192}
"""A small GPT: runs simulate in milliseconds."""


def run(tmp_path: Path, name: str = "run", **options: Any) -> tuple[Any, dict[str, Any]]:
    """Simulate, load, diagnose: (metrics, report)."""
    model = ModelSpec(**{**SMALL, **options.pop("model", {})})
    result = simulate(SimConfig(model=model, **options), tmp_path / name)
    return diagnose(load_any(result.path))


def codes(report: dict[str, Any], severity: str | None = None) -> set[str]:
    return {f["rule"] for f in report["findings"] if severity in (None, f["severity"])}


# --- 1. The pipeline bubble of the seed, exactly ----------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "pp", "m", "v"),
    [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("gpipe", 8, 4, 1), ("1f1b", 8, 4, 1),
     ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 4)],
)  # fmt: skip
def test_bubble_is_the_theory_without_communication(
    tmp_path: Path, schedule: str, pp: int, m: int, v: int
) -> None:
    metrics, _ = run(
        tmp_path, pp=pp, microbatches=m, schedule=schedule, virtual_stages=v, steps=4,
        jitter=0.0, opt_ms=0.0, hardware=HardwareSpec(comm_scale=0.0),
        model={"layers": 2 * pp * v, "lm_head": False},
    )  # fmt: skip
    theory = (pp - 1) / (v * m + pp - 1)
    assert theory == ledger.bubble_fraction(pp, m, v)
    assert metrics.summary["bubble_theory"] == pytest.approx(theory, abs=1e-12)
    assert metrics.summary["bubble_fraction"] == pytest.approx(theory, abs=1e-6)
    stages = metrics.ranks.set_index("stage")["bubble_frac"].astype(float)
    assert sorted(stages.index) == list(range(pp))
    assert stages.to_numpy() == pytest.approx([theory] * pp, abs=1e-6)


def test_seed_example_p8_m4_idles_64_percent(tmp_path: Path) -> None:
    metrics, report = run(
        tmp_path, pp=8, microbatches=4, steps=4, jitter=0.0, opt_ms=0.0,
        hardware=HardwareSpec(comm_scale=0.0), model={"layers": 8, "lm_head": False},
    )  # fmt: skip
    assert metrics.summary["bubble_fraction"] == pytest.approx(7 / 11, abs=1e-6)
    assert "PIP002" in codes(report, "high")


def test_communication_adds_to_the_bubble(tmp_path: Path) -> None:
    """Pipeline boundaries across nodes: sends cost time, the bubble exceeds the theory."""
    metrics, _ = run(
        tmp_path, pp=4, microbatches=8, steps=4, jitter=0.0, gpus_per_node=1,
        model={"layers": 8, "lm_head": False},
    )  # fmt: skip
    assert metrics.summary["bubble_fraction"] > metrics.summary["bubble_theory"] + 0.01


# --- 2. TP stretched across nodes ------------------------------------------------------------


def test_tp_across_nodes_loses_an_order_of_magnitude(tmp_path: Path) -> None:
    """TP=8 inside one 8-GPU node against TP=8 over two 4-GPU nodes, for a TP-communication-
    bound model: the TP collectives take >= 10x as long, throughput falls about 10x."""
    model = {"layers": 8, "hidden": 512, "heads": 8, "micro_batch": 4}
    inside, inside_report = run(tmp_path, "in", tp=8, gpus_per_node=8, steps=5, model=model)
    across, across_report = run(tmp_path, "out", tp=8, gpus_per_node=4, steps=5, model=model)

    def tp_seconds(metrics: Any) -> float:
        table = metrics.collectives
        return float(table.loc[table["group"] == "tp", "time_s"].sum())

    assert tp_seconds(across) / tp_seconds(inside) >= 10
    slowdown = inside.summary["tokens_per_s"] / across.summary["tokens_per_s"]
    assert 8 <= slowdown <= 20
    assert {"TOP001", "COM002"} <= codes(across_report, "high")
    top = next(f for f in across_report["findings"] if f["rule"] == "TOP001")
    assert top["ranks"] == list(range(8))
    assert "TOP001" not in codes(inside_report)
    for metrics in (inside, across):  # 2 all-reduces per layer forward, 2 backward
        rows = {r["direction"]: r for r in metrics.summary["tp_vs_ledger"]}
        assert rows["fwd"]["ratio"] == rows["bwd"]["ratio"] == 1
        assert rows["fwd"]["count_per_step"] == 2 * 8


# --- 3. A straggler paces the whole job ------------------------------------------------------


def test_tp_collectives_of_a_3d_layout_match_the_ledger_per_rank(tmp_path: Path) -> None:
    """With pp = 2 each rank holds half the layers: 2 x (L / pp) x m all-reduces each way."""
    metrics, _ = run(tmp_path, dp=2, tp=2, pp=2, microbatches=4, steps=3, gpus_per_node=8)
    rows = {row["direction"]: row for row in metrics.summary["tp_vs_ledger"]}
    for way in ("fwd", "bwd"):
        assert rows[way]["count_per_step"] == 2 * (SMALL["layers"] / 2) * 4
        assert rows[way]["ledger_count_per_step"] == rows[way]["count_per_step"]
        assert rows[way]["ratio"] == pytest.approx(1.0)


def test_straggler_in_one_dp_replica_paces_the_job(tmp_path: Path) -> None:
    layout = {"dp": 4, "tp": 2, "steps": 8}
    healthy, _ = run(tmp_path, "healthy", **layout)
    slow, report = run(tmp_path, "slow", **layout, inject=("straggler:rank=2,ms=20",))
    steps = slow.ranks["step_time_s"]
    assert steps.max() / steps.min() < 1.01  # every rank runs at the straggler's pace
    extra = float(steps.mean() - healthy.ranks["step_time_s"].mean())
    assert extra == pytest.approx(0.020, rel=0.1)  # its 20 ms per micro-batch, for everyone
    blamed = {f["rule"]: f["ranks"] for f in report["findings"] if f["ranks"]}
    assert blamed.get("BAL001") == [2]
    assert set(blamed) <= {"BAL001", "BAL003"} and all(r == [2] for r in blamed.values())
    busy = slow.ranks.set_index("rank")["busy_s"]
    assert busy[2] > 5 * busy.drop(2).max()


def test_straggler_in_a_pipeline_paces_every_stage(tmp_path: Path) -> None:
    metrics, report = run(
        tmp_path, dp=2, pp=2, microbatches=8, steps=6, model={"layers": 4},
        inject=("straggler:rank=1,ms=5",),
    )  # fmt: skip
    steps = metrics.ranks["step_time_s"]
    assert steps.max() / steps.min() < 1.01
    assert next(f for f in report["findings"] if f["rule"] == "BAL001")["ranks"] == [1]


# --- 4. The five collapse patterns, diagnosed as real ones -----------------------------------

COLLAPSES = {
    # 1: more GPUs, slower: TP over the inter-node link
    "tp_over_ib": ({"tp": 8, "gpus_per_node": 4, "steps": 5}, {"TOP001", "COM002", "COM001"}),
    # 2: throughput decays (compute that slows), memory creeps (pattern 5 rule TRD002)
    "slowdown": ({"dp": 4, "steps": 16, "inject": ("slowdown:ms=2",)}, {"TRD001"}),
    "leak": ({"dp": 4, "steps": 16, "inject": ("leak:mb=100",)}, {"TRD002"}),
    # 3: speedup far below theory: too few micro-batches for the stages
    "few_microbatches": (
        {"dp": 2, "pp": 4, "microbatches": 2, "steps": 5, "model": {"layers": 8}},
        {"PIP002"},
    ),
    # 4: MoE: a hot expert, drops from a small capacity factor
    "expert_skew": (
        {"dp": 2, "ep": 4, "steps": 5, "model": {"experts": 8}, "inject": ("skew:frac=0.7",)},
        {"MOE002"},
    ),
    "expert_drops": (
        {"dp": 2, "ep": 4, "steps": 5, "model": {"experts": 8, "capacity_factor": 0.5}},
        {"MOE001"},
    ),
    # a slow link on one group, a forgotten set_epoch (pitfall)
    "slow_tp_link": (
        {"dp": 2, "tp": 2, "steps": 6, "inject": ("slow-comm:ms=1,group=tp",)},
        {"COM002"},
    ),
    "no_set_epoch": ({"dp": 2, "steps": 12, "inject": ("no-set-epoch",)}, {"PIT001"}),
    # 5: memory over the device: activations of long sequences
    "activations_oom": (
        {
            "dp": 2,
            "steps": 4,
            "model": {"seq_len": 8192, "micro_batch": 4},
            "hardware": HardwareSpec(device_memory_gb=16),
        },
        {"MEM001"},
    ),
}


@pytest.mark.parametrize("name", list(COLLAPSES))
def test_rules_diagnose_simulated_collapses(tmp_path: Path, name: str) -> None:
    options, expected = COLLAPSES[name]
    _, report = run(tmp_path, **{**options, "model": dict(options.get("model", {}))})
    assert expected <= codes(report), report["findings"]


def test_memory_over_budget_is_activations_with_oom_risk_events(tmp_path: Path) -> None:
    options = COLLAPSES["activations_oom"][0]
    _, report = run(tmp_path, **{**options, "model": dict(options["model"])})
    finding = next(f for f in report["findings"] if f["rule"] == "MEM001")
    assert finding["severity"] == "high"
    assert finding["evidence"]["dominant"] == "activations"
    data = load_run(tmp_path / "run")
    risks = data.events[data.events["name"] == "oom_risk"]
    assert len(risks) == 2 * 4  # one per rank and step


def test_memory_follows_schedule_and_zero_stage(tmp_path: Path) -> None:
    """GPipe holds all m micro-batches' activations, 1F1B about p on the first stage; ZeRO-1
    shards the optimizer state over dp."""
    common: dict[str, Any] = {"pp": 4, "microbatches": 8, "steps": 3, "model": {"layers": 8}}
    activations = {}
    for schedule in ("gpipe", "1f1b"):
        run(tmp_path, schedule, schedule=schedule, **{**common, "model": {"layers": 8}})
        memory = load_run(tmp_path / schedule).memory
        activations[schedule] = float(memory.loc[memory["rank"] == 0, "activations"].max())
    assert activations["gpipe"] == pytest.approx(2 * activations["1f1b"])  # m = 8 against p = 4
    plain, _ = run(tmp_path, "zero0", dp=4, steps=3)
    sharded, _ = run(tmp_path, "zero1", dp=4, steps=3, zero_stage=1)
    assert sharded.memory["optimizer"].max() == pytest.approx(plain.memory["optimizer"].max() / 4)
    assert sharded.memory["params"].max() == plain.memory["params"].max()


def test_expert_skew_growth_grows_the_load_imbalance(tmp_path: Path) -> None:
    metrics, report = run(
        tmp_path, dp=2, ep=4, steps=12, model={"experts": 8},
        inject=("skew-growth:per_step=0.05",),
    )  # fmt: skip
    row = metrics.experts.iloc[0]
    assert row["max_over_mean_last"] > 1.5 * row["max_over_mean_first"]
    assert "MOE002" in codes(report)


@pytest.mark.parametrize(
    "options",
    [
        {"dp": 8, "steps": 6, "model": {"layers": 8, "hidden": 4096, "heads": 32}},
        {"dp": 2, "tp": 4, "pp": 2, "microbatches": 16, "steps": 5,
         "model": {"layers": 8, "hidden": 4096, "heads": 32}},
        {"dp": 2, "ep": 4, "steps": 5, "model": {"experts": 8}},
    ],
    ids=["dp8", "dp2-tp4-pp2", "dp2-ep4"],
)  # fmt: skip
def test_a_healthy_simulated_run_has_no_high_finding(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    _, report = run(tmp_path, **options)
    assert not codes(report, "high"), report["findings"]


# --- 5. The run directory and the command line -----------------------------------------------


def test_run_directory_follows_the_contract(tmp_path: Path) -> None:
    result = simulate(
        SimConfig(dp=2, pp=2, tp=2, ep=2, microbatches=4, steps=3, gpus_per_node=4,
                  model=ModelSpec(**{**SMALL, "experts": 4})),
        tmp_path / "run",
    )  # fmt: skip
    data = load_run(result.path)
    assert data.skipped == []
    manifest = data.manifest
    assert manifest.world_size == 16 and manifest.status == "complete"
    assert manifest.steps_completed == 3
    assert [r.host for r in manifest.ranks[:5]] == ["node0"] * 4 + ["node1"]
    assert manifest.groups["tp"][0] == [0, 1] and manifest.groups["ep"][0] == [0, 2]
    assert manifest.groups["pp"][0] == [0, 4] and manifest.groups["dp"][0] == [0, 8]
    assert manifest.hardware.device_memory_bytes == 80 * 10**9
    assert len(data.steps) == 16 * 3
    assert set(data.spans["phase"]) >= {"fwd", "bwd", "opt"}
    tags = set(data.comms["tag"])
    assert {"tp.attn.fwd", "tp.mlp.bwd", "act", "grad", "dispatch", "combine.bwd"} <= tags
    assert (data.comms["t1"] >= data.comms["t0"]).all()
    assert sorted(p.name for p in (tmp_path / "run").glob("rank-*"))[0] == "rank-00000.arrows"
    metas = [r for r in rank_records(tmp_path / "run" / "rank-00000.arrows") if r["kind"] == "meta"]
    assert len(metas) == 1 and metas[0]["rank"] == 0
    assert len(data.experts) == 4 * 2 * 3  # per MoE layer (on its stage), dp replica and step


@pytest.mark.parametrize("format", ["arrow", "jsonl"])
def test_same_seed_same_run(tmp_path: Path, format: str) -> None:
    config = SimConfig(dp=2, tp=2, steps=3, model=ModelSpec(**SMALL))
    simulate(config, tmp_path / "a", format=format)
    simulate(config, tmp_path / "b", format=format)
    for rank in range(4):
        name = f"rank-{rank:05d}.{'arrows' if format == 'arrow' else 'jsonl'}"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    if format == "jsonl":  # the meta record is the first line
        first = (tmp_path / "a" / "rank-00000.jsonl").read_text().splitlines()[0]
        assert json.loads(first)["kind"] == "meta"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (SimConfig(dp=2, tp=4, ranks=12), "= 8 ranks, but --ranks is 12"),
        (SimConfig(pp=3, model=ModelSpec(layers=8)), "must be divisible by --pp (3)"),
        (SimConfig(tp=3, model=ModelSpec(heads=32)), "divisible by tp (3)"),
        (SimConfig(ep=2), "needs a mixture-of-experts model"),
        (SimConfig(ep=3, model=ModelSpec(experts=8)), "experts (8) must be divisible by ep"),
        (SimConfig(pp=4, schedule="interleaved", microbatches=6, model=ModelSpec(layers=8)),
         "divisible by --pp"),
        (SimConfig(dp=2, inject=("straggler:rank=5,ms=1",)), "rank 5 is not in 0..1"),
        (SimConfig(dp=2, inject=("skew:frac=0.5",)), "needs a MoE model"),
        (SimConfig(dp=2, pp=2, inject=("stage-slow:stage=2,ms=1",)), "stage 2 is not in 0..1"),
        (SimConfig(dp=2, inject=("stage-slow:stage=1,ms=1",)), "stage 1 is not in 0..0"),
        (SimConfig(dp=2, inject=("loader-stall:rank=2,ms=1",)), "rank 2 is not in 0..1"),
        (SimConfig(hardware=HardwareSpec(mfu=0)), "mfu must be in (0, 1]"),
    ],
)  # fmt: skip
def test_impossible_configurations_are_one_line_errors(
    tmp_path: Path, config: SimConfig, message: str
) -> None:
    with pytest.raises(SimulationError) as caught:
        simulate(config, tmp_path / "run")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_cli_simulate_then_analyze(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    result = CliRunner().invoke(main, [
        "simulate", "--layout", "dp=2,tp=2,pp=2,m=4", "--gpus-per-node", "4", "--steps", "4",
        "--layers", "4", "--hidden", "1024", "--heads", "16", "--seq-len", "1024",
        "--inject", "straggler:rank=3,ms=5", "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"run directory: {out}" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layout"]["microbatches"] == 4 and manifest["layout"]["pp"] == 2
    assert manifest["injections"] == ["straggler:rank=3,ms=5"]
    assert manifest["command"].startswith("diag simulate")
    analyzed = CliRunner().invoke(main, ["analyze", str(out)])
    assert analyzed.exit_code == 0, analyzed.output
    assert "BAL001" in analyzed.output


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--ranks", "12", "--layout", "dp=2,tp=4"], "but --ranks is 12"),
        (["--layout", "dp=2,pp=3", "--layers", "8"], "--layers (8) must be divisible"),
        (["--layout", "dp=2,zz=3"], "unknown dimension 'zz'"),
        (["--layout", "tp=16", "--heads", "8"], "divisible by tp (16)"),
        (["--ranks", "4", "--inject", "leak:gb=3"], "unknown key 'gb'"),
        (["--ranks", "4", "--inject", "jitter:ms=-1"], "must be a finite number >= 0"),
        ([], "give --ranks N or --layout"),
    ],
)
def test_cli_rejects_impossible_layouts_in_one_line(
    tmp_path: Path, args: list[str], reason: str
) -> None:
    result = CliRunner().invoke(main, ["simulate", *args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("diag: error: ") and reason in result.stderr
    assert not (tmp_path / "x").exists()


# --- The injections of sequence-length imbalance, heavy stages and slow loaders --------------


def _records(tmp_path: Path, name: str, **options: Any) -> Any:
    """The loaded run of a simulation without the engine's own compute noise."""
    model = ModelSpec(**{**SMALL, **options.pop("model", {})})
    result = simulate(SimConfig(model=model, jitter=0.0, **options), tmp_path / name)
    return load_run(result.path)


def _span_ns(run: Any) -> Any:
    """Span durations (ns) keyed by rank, step, phase, mb, stage, chunk."""
    spans = run.spans[run.spans["phase"].isin(["fwd", "bwd"])].copy()
    spans["ns"] = spans["t1"] - spans["t0"]
    return spans.set_index(["rank", "step", "phase", "mb", "stage", "chunk"])["ns"].sort_index()


def test_stage_slow_lengthens_its_stage_forwards_by_m_per_micro_batch(tmp_path: Path) -> None:
    layout = {"dp": 2, "pp": 2, "microbatches": 4, "steps": 3}
    healthy = _span_ns(_records(tmp_path, "healthy", **layout))
    slow = _span_ns(_records(tmp_path, "slow", **layout, inject=("stage-slow:stage=1,ms=5",)))
    extra = (slow - healthy).reset_index()
    on_stage = extra["stage"] == 1
    fwd = extra["phase"] == "fwd"
    assert extra[on_stage & fwd]["ns"].to_numpy() == pytest.approx(5e6, abs=1)
    assert (extra[~(on_stage & fwd)]["ns"].abs() <= 1).all()  # bwd and stage 0 as healthy
    per_mb = extra[on_stage].groupby(["rank", "step", "mb"])["ns"].sum()
    assert per_mb.to_numpy() == pytest.approx(5e6, abs=2)  # M more per micro-batch
    assert set(extra[on_stage]["rank"]) == {1, 3}


def test_stage_slow_without_a_pipeline_is_every_rank(tmp_path: Path) -> None:
    healthy = _span_ns(_records(tmp_path, "healthy", dp=2, microbatches=2, steps=2))
    slow = _span_ns(_records(tmp_path, "slow", dp=2, microbatches=2, steps=2,
                             inject=("stage-slow:stage=0,ms=3",)))  # fmt: skip
    extra = (slow - healthy).reset_index()
    assert extra[extra["phase"] == "fwd"]["ns"].to_numpy() == pytest.approx(3e6, abs=1)


def test_jitter_delays_each_rank_and_step_differently_within_bounds(tmp_path: Path) -> None:
    layout = {"dp": 4, "microbatches": 2, "steps": 5, "seed": 7}
    healthy = _span_ns(_records(tmp_path, "healthy", **layout))
    jittered = _span_ns(_records(tmp_path, "jitter", **layout, inject=("jitter:ms=20",)))
    extra = (jittered - healthy).reset_index()
    first = extra[(extra["phase"] == "fwd") & (extra["mb"] == 0)]
    assert (extra.drop(first.index)["ns"].abs() <= 1).all()  # once per step, in its first fwd
    delays = first.set_index(["rank", "step"])["ns"] / 1e6
    assert ((delays >= 0) & (delays <= 20)).all()
    assert delays.round(6).nunique() == len(delays) == 4 * 5  # differ by rank and by step
    spec = [parse_injection("jitter:ms=20")]
    for (rank, step), ms in delays.items():  # the trainers' draws (diag.contract.injections)
        assert ms == pytest.approx(jitter_ms(spec, int(rank), int(step), seed=7), abs=1e-5)
    again = _span_ns(_records(tmp_path, "again", **layout, inject=("jitter:ms=20",)))
    assert again.equals(jittered)


def test_loader_stall_leaves_an_unrecorded_gap_before_each_step(tmp_path: Path) -> None:
    layout = {"dp": 2, "microbatches": 2, "steps": 4}
    run = _records(tmp_path, "stall", **layout, inject=("loader-stall:rank=1,ms=30",))
    steps = run.steps.sort_values(["rank", "step"]).set_index(["rank", "step"])
    origin = steps["t0"].min()
    starts, ends = steps["t0"] - origin, steps["t1"] - origin
    assert starts[(1, 0)] == pytest.approx(30e6, abs=1) and starts[(0, 0)] == 0
    for step in range(1, 4):
        assert starts[(1, step)] - ends[(1, step - 1)] == pytest.approx(30e6, abs=1)
        assert starts[(0, step)] - ends[(0, step - 1)] == pytest.approx(0, abs=1)
    mine = run.spans[run.spans["rank"] == 1]
    bounds = steps.loc[1]
    for step, spans in mine.groupby("step"):  # no span covers the gap
        assert spans["t0"].min() >= bounds.loc[step, "t0"]
    healthy = _span_ns(_records(tmp_path, "healthy", **layout))
    assert (_span_ns(run).loc[1] - healthy.loc[1]).abs().max() <= 1  # compute unchanged
