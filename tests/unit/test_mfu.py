"""MFU and TFLOP/s per GPU (diag/metrics/flops.py, docs/metrics.md "MFU"): the FLOPs per token of
known models, the simulator's own FLOP accounting (a simulated device at 50% efficiency measures 50%
of its compute share), null with a note on CPU or without a model, `--model` and `--peak-tflops`,
and the headline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diag import diagnose, load_any
from diag.cli.main import main
from diag.contract import schema
from diag.metrics import flops

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden-runs"
REAL_TRACES = ROOT.parent / "shared" / "real-traces"
EFFICIENCY = 0.5
"""The simulator's `--mfu`: the share of the device's peak its kernels reach while computing."""


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_gpt3_175b_counts_its_parameters_and_attention() -> None:
    model = schema.ModelInfo(layers=96, hidden=12288, seq_len=2048, vocab=50257)
    per_token = flops.flops_per_token(model)
    assert per_token is not None
    assert per_token.active_params == pytest.approx(175e9, rel=0.01)  # "175B"
    attention = 12 * 96 * 12288 * 2048
    assert per_token.flops == 6 * per_token.active_params + attention


def test_a_mixture_of_experts_counts_the_experts_a_token_visits() -> None:
    dense = schema.ModelInfo(layers=4, hidden=1024, seq_len=512, vocab=32000, ffn_hidden=4096)
    moe = schema.ModelInfo(**{**dense.__dict__, "experts": 8, "topk": 2})
    dense_params = flops.active_params(dense)
    moe_params = flops.active_params(moe)
    assert dense_params is not None and moe_params is not None
    # one more expert MLP per layer (2 h x f matrices) and the router (h x E)
    assert moe_params - dense_params == 4 * (2 * 1024 * 4096 + 1024 * 8)


@pytest.mark.parametrize(
    "model",
    [schema.ModelInfo(), schema.ModelInfo(layers=2, hidden=64, vocab=100),
     schema.ModelInfo(layers=2, hidden=-64, seq_len=8, vocab=100),
     schema.ModelInfo(layers=True, hidden=64, seq_len=8, vocab=100)],  # type: ignore[arg-type]
)  # fmt: skip
def test_an_unknown_model_has_no_flops(model: schema.ModelInfo) -> None:
    assert flops.flops_per_token(model) is None
    fields = flops.mfu_summary(model, 1000.0, 2, 989.0)
    assert fields["mfu"] is None and "model unknown" in fields["mfu_note"]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Simulated H100 jobs (diag simulate: FLOPs over the device rate at EFFICIENCY), no
    communication cost and no jitter, dense and MoE."""
    root = tmp_path_factory.mktemp("mfu")
    common = ["--ranks", "4", "--steps", "4", "--comm-scale", "0", "--jitter", "0",
              "--mfu", str(EFFICIENCY), "--layers", "2", "--hidden", "1024", "--heads", "8",
              "--seq", "1024", "--micro-batch", "2"]  # fmt: skip
    runs = {"dense": root / "dense", "moe": root / "moe"}
    for name, extra in (("dense", []), ("moe", ["--experts", "8", "--topk", "2"])):
        result = _cli("simulate", *common, *extra, "--out", str(runs[name]))
        assert result.exit_code == 0, result.output
    return runs


@pytest.mark.parametrize(("name", "tolerance"), [("dense", 1e-4), ("moe", 5e-3)])
def test_mfu_agrees_with_the_simulators_flops(
    simulated: dict[str, Path], name: str, tolerance: float
) -> None:
    """The simulator times each forward and backward from its own FLOP count (Narayanan et al.)
    at EFFICIENCY of the peak, so MFU must be EFFICIENCY x the share of the step spent in them
    (MoE: the routed tokens vary a little around topk per token)."""
    run = load_any(simulated[name])
    metrics, report = diagnose(run)
    summary = report["summary"]
    spans = run.spans[run.spans["step"].isin(metrics.rank_steps["step"].unique())]
    compute = spans[spans["phase"].isin(["fwd", "bwd"])]
    compute_share = (compute["t1"] - compute["t0"]).sum() / (
        metrics.rank_steps["wall_s"].sum() * 1e9
    )
    assert (
        summary["peak_tflops_per_gpu"] == 989.0
    )  # the simulated H100, from diag/contract/devices.py
    assert summary["mfu"] == pytest.approx(EFFICIENCY * compute_share, rel=tolerance)
    assert summary["model_tflops_per_gpu"] == pytest.approx(989.0 * summary["mfu"])
    assert summary["mfu_note"] is None


def test_the_headline_shows_mfu_and_tflops(simulated: dict[str, Path]) -> None:
    result = _cli("analyze", str(simulated["dense"]), "--format", "json")
    summary = json.loads(result.output)["summary"]
    text = _cli("analyze", str(simulated["dense"])).output.splitlines()[0]
    mfu, tflops = round(100 * summary["mfu"]), f"{summary['model_tflops_per_gpu']:.3g}"
    assert f"MFU {mfu}% ({tflops} TFLOP/s per GPU)" in text


def test_a_cpu_run_has_tflops_but_no_mfu_and_says_why(tmp_path: Path) -> None:
    run = shutil.copytree(GOLDEN / "dp", tmp_path / "dp")
    result = _cli("analyze", str(run), "--format", "json")
    summary = json.loads(result.output)["summary"]
    assert summary["mfu"] is None and summary["peak_tflops_per_gpu"] is None
    assert "'cpu'" in summary["mfu_note"] and "--peak-tflops" in summary["mfu_note"]
    assert summary["model_tflops_per_gpu"] > 0
    assert "MFU" not in _cli("analyze", str(run)).output.splitlines()[0]
    # a peak given by hand makes the MFU of the measured rate
    given = json.loads(_cli("analyze", str(run), "--format", "json", "--peak-tflops", "0.5").output)
    assert given["summary"]["mfu"] == pytest.approx(summary["model_tflops_per_gpu"] / 0.5)
    assert given["summary"]["peak_tflops_per_gpu"] == 0.5


def test_model_overrides_the_manifest(tmp_path: Path) -> None:
    run = shutil.copytree(GOLDEN / "dp", tmp_path / "dp")
    base = json.loads(_cli("analyze", str(run), "--format", "json").output)
    wider = json.loads(_cli("analyze", str(run), "--format", "json", "--model", "layers=4").output)
    assert wider["run"]["model"]["layers"] == 4
    assert wider["summary"]["model_flops_per_token"] > base["summary"]["model_flops_per_token"]
    assert wider["summary"]["tokens_per_s"] == base["summary"]["tokens_per_s"]


@pytest.mark.parametrize("spec", ["layers=x", "depth=2", "layers", "hidden=0"])
def test_a_bad_model_spec_is_one_line(spec: str) -> None:
    result = _cli("analyze", str(GOLDEN / "dp"), "--model", spec)
    assert result.exit_code == 2
    assert "--model" in result.output


def test_devices_of_different_peaks_give_no_peak() -> None:
    ranks = [schema.RankInfo(0, device_name="NVIDIA H100 80GB HBM3"),
             schema.RankInfo(1, device_name="NVIDIA A100-SXM4-80GB")]  # fmt: skip
    assert flops.device_peak_tflops(ranks) == (
        None, "the run mixes devices of different peaks; give --peak-tflops"
    )  # fmt: skip
    assert flops.device_peak_tflops(ranks[:1]) == (989.0, None)


@pytest.mark.skipif(not REAL_TRACES.is_dir(), reason="the real Kineto traces are not here")
def test_a_trace_folder_takes_the_model_and_its_batch(tmp_path: Path) -> None:
    folder = shutil.copytree(REAL_TRACES / "hta-nccl-world2", tmp_path / "traces")
    plain = json.loads(_cli("analyze", str(folder), "--format", "json").output)["summary"]
    assert plain["mfu"] is None and "model unknown" in plain["mfu_note"]
    spec = "layers=12,hidden=768,seq=1024,vocab=50257,batch=8"
    given = json.loads(
        _cli("analyze", str(folder), "--format", "json", "--model", spec, "--peak-tflops", "312")
        .output
    )["summary"]  # fmt: skip
    world = given["world_size"]
    tokens_per_s = 8 * 1024 * world / given["step_time_s"]  # dp = the world for a trace folder
    per_token = given["model_flops_per_token"]
    assert given["model_tflops_per_gpu"] == pytest.approx(tokens_per_s * per_token / world / 1e12)
    assert given["mfu"] == pytest.approx(given["model_tflops_per_gpu"] / 312)
