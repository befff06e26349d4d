"""diag plan's inputs (issue 29 items 7/8 and 4): every bad input one line and exit 2 within a
second, the search bounded (`--gpus 1000000000` answers), "no layout fits" said in memory
terms, each device generation's compute efficiency, and a header naming what was given."""

from __future__ import annotations

import json
import math
import time

import pytest
from click.testing import CliRunner

import diag.cli.plan  # noqa: F401  (imported once here: the timings below are the command's)
from diag.cli.main import main
from diag.contract.devices import DEVICES, device_by_key
from diag.contract.input_rules import RuleError, check_model
from diag.plan import Job, Layout, SearchSpace, cluster_from_device, make_plan
from diag.plan.divisors import divisors, prime_factors
from diag.plan.models import preset, preset_job
from diag.plan.render import plan_text
from simulator import ModelSpec, SimConfig, SimulationError

SMALL = ["--layers", "4", "--hidden", "512", "--heads", "8", "--seq", "512", "--vocab", "1000"]
CLUSTER = ["--gpus", "8", "--global-batch", "8"]


def _invoke(*args: str) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["plan", *args])
    return result.exit_code, result.stdout, result.stderr, time.perf_counter() - start


# --- every bad input: one line naming the option, exit 2, under a second ------------------------

BAD = [
    ([*SMALL, *CLUSTER, "--zero", "5"], "--zero: 5 is not a ZeRO stage"),
    ([*SMALL, *CLUSTER, "--zero", "1,7"], "--zero: 7 is not a ZeRO stage"),
    ([*SMALL, "--gpus", "8", "--layout", "dp=8,zero=5"], "zero 5 is not a ZeRO stage"),
    (
        ["--layers", "4", "--hidden", "500", "--heads", "8", *CLUSTER],
        "--heads: 8 does not divide hidden (500)",
    ),
    ([*SMALL, "--kv-heads", "3", *CLUSTER], "--kv-heads: 3 does not divide the 8 heads"),
    ([*SMALL, "--kv-heads", "16", *CLUSTER], "--kv-heads: 16 is more than the 8 heads"),
    ([*SMALL, "--experts", "1", *CLUSTER], "--experts: must be 0 (dense) or >= 2"),
    ([*SMALL, "--experts", "-2", *CLUSTER], "--experts: must be 0 (dense) or >= 2"),
    ([*SMALL, "--experts", "4", "--topk", "5", *CLUSTER], "--topk: 5 is not in 1..experts (4)"),
    ([*SMALL, "--gpus", "8", "--layout", "dp=8,m=0"], "m must be a whole number >= 1, got 0"),
    ([*SMALL, "--gpus", "8", "--layout", "dp=4,pp=2,m=4,v=0"], "v must be a whole number >= 1"),
    ([*SMALL, "--gpus", "8", "--layout", "dp=8,v=2"], "v=2 interleaves pipeline stages"),
    ([*SMALL, "--gpus", "8", "--layout", "dp=8,ep=0"], "ep must be a whole number >= 1"),
    ([*SMALL, "--gpus", "8", "--layout", "dp=8,qq=1"], "--layout: 'qq=1' in 'dp=8,qq=1'"),
    ([*SMALL, "--gpus", "3", "--layout", "tp=3"], "tp=3 does not divide heads (8)"),
    ([*SMALL, "--gpus", "8"], "--global-batch: is required for a search"),
    ([*SMALL, "--global-batch", "8"], "--gpus: the GPUs in the cluster are needed"),
    (["--gpus", "8", "--global-batch", "8"], "--model: give a preset or the model's shape"),
    ([*SMALL, "--gpus", "0", "--global-batch", "8"], "--gpus: must be a whole number >= 1"),
    ([*SMALL, "--gpus", "abc", "--global-batch", "8"], "--gpus: 'abc' is not a valid integer"),
    ([*SMALL, *CLUSTER, "--micro-batch", "3"], "--global-batch: 8 sequences are not a whole"),
    ([*SMALL, *CLUSTER, "--compute-efficiency", "1.5"], "--compute-efficiency: must be in (0, 1]"),
    ([*SMALL, *CLUSTER, "--memory-gb", "-1"], "--memory-gb: must be a finite number > 0"),
    ([*SMALL, *CLUSTER, "--peak-tflops", "nan"], "--peak-tflops: must be a finite number > 0"),
    ([*SMALL, *CLUSTER, "--params", "0"], "--params: must be a finite number > 0"),
    ([*SMALL, *CLUSTER, "--recompute", "some"], "--recompute: 'some' is not one of"),
    ([*SMALL, *CLUSTER, "--max-layouts", "0"], "--max-layouts: must be a whole number >= 1"),
    ([*SMALL, *CLUSTER, "--max-v", "0"], "--max-v: must be a whole number >= 1"),
    ([*SMALL, *CLUSTER, "--seq", "0"], "--seq: must be a whole number >= 1"),
    ([*SMALL, *CLUSTER, "--framework", "jax"], "--framework: 'jax' is not one of"),
    ([*SMALL, *CLUSTER, "--framework", "megatron", "--zero", "0,3"], "--zero: 3: megatron"),
    ([*SMALL, *CLUSTER, "--framework", "fsdp", "--zero", "1"], "--zero: 1: fsdp"),
    (
        [*SMALL, *CLUSTER, "--framework", "fsdp", "--sequence-parallel", "on"],
        "--sequence-parallel: on: fsdp",
    ),
    ([*SMALL, *CLUSTER, "--framework", "deepspeed", "--max-v", "2"], "--max-v: 2: deepspeed"),
    ([*SMALL, *CLUSTER, "--framework", "fsdp", "--max-cp", "2"], "--max-cp: 2: fsdp"),
    (
        [*SMALL, *CLUSTER, "--framework", "deepspeed", "--recompute", "selective"],
        "--recompute: selective: deepspeed",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[m for _, m in BAD])
def test_a_bad_input_is_one_line_and_exit_2_within_a_second(args: list[str], message: str) -> None:
    code, out, err, elapsed_s = _invoke(*args)
    assert code == 2, (out, err)
    assert out == ""
    assert err.startswith("diag: error: ") and err.count("\n") == 1, err
    assert message in err
    assert elapsed_s < 1.0, f"{elapsed_s:.2f} s"


def test_help_says_a_search_needs_the_global_batch() -> None:
    result = CliRunner().invoke(main, ["plan", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--global-batch INTEGER Sequences per step. Required for a search" in text


def test_simulate_shares_the_shape_rules() -> None:
    model = ModelSpec(heads=32, kv_heads=5)
    with pytest.raises(RuleError) as shared:
        check_model(model)
    with pytest.raises(SimulationError) as simulated:
        SimConfig(model=model).check()
    assert str(simulated.value) == str(shared.value)
    assert "kv_heads 5 does not divide the 32 heads" in str(simulated.value)
    with pytest.raises(SimulationError, match="zero_stage 5 is not a ZeRO stage"):
        SimConfig(dp=2, zero_stage=5).check()
    with pytest.raises(SimulationError, match=r"experts must be 0 \(dense\) or >= 2"):
        SimConfig(model=ModelSpec(experts=1)).check()
    result = CliRunner().invoke(main, ["simulate", "--ranks", "2", "--experts", "1"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1


# --- the search bounded --------------------------------------------------------------------------


def test_divisors_come_from_the_prime_factors() -> None:
    for n in range(1, 600):
        assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0)
    assert len(divisors(10**9)) == 100 and divisors(10**9, 10) == (1, 2, 4, 5, 8, 10)
    start = time.perf_counter()
    big = (10**9 + 7) * (10**9 + 9)  # two 10-digit primes: a loop to n would never end
    assert prime_factors(big) == {10**9 + 7: 1, 10**9 + 9: 1}
    assert prime_factors(2**61 - 1) == {2**61 - 1: 1}
    assert time.perf_counter() - start < 1.0


def test_a_billion_gpus_answer_within_ten_seconds() -> None:
    start = time.perf_counter()
    code, out, err, _ = _invoke(*SMALL, "--gpus", "1000000000", "--global-batch", "1000000000")
    elapsed_s = time.perf_counter() - start
    assert code == 0, err
    assert "plan  1,000,000,000 x" in out and "feasible" in out and "dp=" in out
    assert elapsed_s < 10.0, f"{elapsed_s:.1f} s"


def test_the_cap_cuts_the_search_and_says_so() -> None:
    job = Job(preset("llama3-8b"), 64)
    cluster = cluster_from_device(device_by_key("h100"), 64)
    plan = make_plan(job, cluster, space=SearchSpace(max_layouts=40))
    assert plan.capped_at == 40 and len(plan.evaluated) + len(plan.invalid) == 40
    assert "note: the search stopped at 40 layouts (--max-layouts)" in plan_text(plan)
    whole = make_plan(job, cluster)
    assert whole.capped_at is None and len(whole.evaluated) > 40


# --- no layout fits ------------------------------------------------------------------------------


def test_no_fit_names_the_least_memory_by_category_and_the_nearest_misses() -> None:
    code, out, _, _ = _invoke("--model", "llama3-405b", "--gpus", "8", "--global-batch", "8")
    assert code == 0
    assert "considered 348 layouts: 0 feasible" in out
    assert "no layout fits: the least memory any layout needs is" in out
    assert "per GPU against the device's 80.0 GB" in out
    for category in ("params", "grads", "optimizer", "activations", "fragmentation"):
        assert f"{category} " in out.split("no layout fits")[1]
    assert "nearest misses (memory per GPU, over 80.0 GB)" in out
    _, text, _, _ = _invoke(
        "--model", "llama3-405b", "--gpus", "8", "--global-batch", "8", "--format", "json"
    )
    nofit = json.loads(text)["no_fit"]
    least = nofit["least"]["memory_bytes"]
    assert least["total"] > nofit["budget_bytes"] == 80e9
    assert least["optimizer"] > least["activations"]  # 405B on 8 GPUs: the state is the wall
    over = [m["over_bytes"] for m in nofit["nearest_misses"]]
    assert len(over) == 5 and over == sorted(over) and over[0] > 0
    assert over[0] == pytest.approx(least["total"] - 80e9)
    assert all(nofit["floor_bytes"][k] <= least[k] for k in nofit["floor_bytes"])


def test_a_search_that_fits_has_no_no_fit() -> None:
    plan = make_plan(preset_job("llama3-8b", 64), cluster_from_device(device_by_key("h100"), 64))
    assert plan.ranked and plan.no_fit is None


# --- per-device compute efficiency, and the header ----------------------------------------------


@pytest.mark.parametrize(("key", "share"), [("v100", 0.30), ("a100", 0.55), ("h100", 0.50)])
def test_each_generation_has_its_own_efficiency(key: str, share: float) -> None:
    assert DEVICES[key].compute_efficiency == share
    assert cluster_from_device(device_by_key(key), 8).hardware.mfu == share
    code, out, _, _ = _invoke(*SMALL, *CLUSTER, "--device", key)
    assert code == 0
    assert f"x efficiency {share:.2f} (the {key}'s, docs/plan.md)" in out


def test_every_device_prices_its_compute_at_its_own_efficiency() -> None:
    for key, spec in DEVICES.items():
        hw = cluster_from_device(spec, 8).hardware
        assert 0 < hw.mfu <= 1 and hw.mfu == spec.compute_efficiency, key
        assert hw.flops_per_s == pytest.approx(spec.peak_flops_per_s * spec.compute_efficiency)


def test_the_override_wins_over_the_table() -> None:
    code, out, _, _ = _invoke(
        *SMALL, *CLUSTER, "--device", "v100", "--compute-efficiency", "0.4", "--format", "json"
    )
    assert code == 0
    assert json.loads(out)["cluster"]["hardware"]["mfu"] == 0.4
    _, text, _, _ = _invoke(*SMALL, *CLUSTER, "--device", "v100", "--compute-efficiency", "0.4")
    assert "x efficiency 0.40 (given) = 50.0 TFLOP/s per GPU" in text


def test_a_v100_job_is_priced_near_its_published_throughput() -> None:
    # Megatron-LM 2019 (arXiv 1909.08053): 8.3B, 8-way TP x 64-way DP on 512 V100s, 15.1
    # PFLOP/s counting the recomputed forward: 29.5 TFLOP/s per GPU, 23.6% of 125
    code, out, _, _ = _invoke(
        "--layers", "72", "--hidden", "3072", "--heads", "32", "--seq", "1024", "--vocab",
        "51200", "--gpus", "512", "--device", "v100", "--micro-batch", "8", "--layout",
        "dp=64,tp=8,recompute=full", "--format", "json",
    )  # fmt: skip
    assert code == 0
    (entry,) = json.loads(out)["layouts"]
    assert entry["hfu"] == pytest.approx(15.1e15 / 512 / 125e12, rel=0.15)


def test_the_header_names_what_was_given() -> None:
    code, out, _, _ = _invoke(
        *SMALL, *CLUSTER, "--memory-gb", "40", "--peak-tflops", "312", "--gpus-per-node", "4"
    )
    assert code == 0
    header = out.splitlines()[0]
    assert header.startswith(
        "plan  8 x h100 (memory 40 GB given, peak 312 TFLOP/s given, 4 per node given)"
    )
    assert "NVIDIA H100 SXM 80GB" not in header
    assert "compute 312 TFLOP/s peak x efficiency 0.50 (the h100's" in out
    _, plain, _, _ = _invoke(*SMALL, *CLUSTER)
    assert plain.startswith("plan  8 x NVIDIA H100 SXM 80GB (8 per node, 80 GB)")
    _, links, _, _ = _invoke(*SMALL, *CLUSTER, "--inter-node-GBps", "12.5", "--format", "json")
    assert json.loads(links)["cluster"]["given"] == {"inter_node_GBps": 12.5}
    assert math.isclose(json.loads(links)["cluster"]["hardware"]["inter_node_GBps"], 12.5)


def test_no_fit_says_when_the_leanest_layout_fits_but_is_rejected_otherwise() -> None:
    job = Job(ModelSpec(layers=4, hidden=1024, heads=16, seq_len=1024), 16)
    cluster = cluster_from_device(device_by_key("h100"), 16)
    plan = make_plan(job, cluster, [Layout(dp=1, tp=16, microbatches=16)])
    assert plan.no_fit is not None and plan.no_fit.fits_elsewhere
    assert "but that layout is rejected: TP=16 crosses nodes" in plan_text(plan)
