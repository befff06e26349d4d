"""ZeRO as the frameworks run it: each stage's memory and data-parallel traffic with gradient
accumulation, expert state sharded over the expert-data-parallel group (dp / ep), and the
pipeline engine's refusal of ZeRO-2/3 with pp > 1 (docs/plan.md, "ZeRO stages")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from diag.cli.main import main
from diag.plan import Cluster, Evaluation, Job, Layout, make_plan
from diag.plan.evaluate import PIPELINE_ENGINE_NOTE, evaluate
from diag.plan.frameworks import ZERO2_BUCKET_BYTES
from diag.plan.memory import stage_expert_params, stage_params
from simulator.config import ModelSpec
from simulator.hardware import HardwareSpec

DENSE = ModelSpec(layers=8, hidden=4096, heads=32, seq_len=2048, vocab=50304)
MOE = ModelSpec(
    layers=8, hidden=4096, heads=32, seq_len=2048, vocab=32000, experts=8, topk=2
)  # fmt: skip
DP = 8


def _cluster(gpus: int) -> Cluster:
    """One GPU per node: every DP group crosses nodes, so its reduction shows in the step."""
    return Cluster(gpus, 1, HardwareSpec())


def _evaluate(model: ModelSpec, layout: Layout) -> tuple[Job, Evaluation]:
    job = Job(model, layout.dp * layout.microbatches, 1)
    return job, evaluate(job, layout, _cluster(layout.world))


@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_memory_per_stage(zero: int, m: int) -> None:
    layout = Layout(dp=DP, zero=zero, microbatches=m)
    job, e = _evaluate(DENSE, layout)
    p = stage_params(job, layout)
    assert e.memory.params == pytest.approx(2 * p / (DP if zero >= 3 else 1))
    # ZeRO-2: the 1/dp partition plus one full-size reduce bucket (DeepSpeed's 5e8 elements)
    grads = {0: 2 * p, 1: 2 * p, 2: 2 * p / DP + min(2 * p, ZERO2_BUCKET_BYTES), 3: 2 * p / DP}
    assert e.memory.grads == pytest.approx(grads[zero])
    assert e.memory.optimizer == pytest.approx(12 * p / (DP if zero >= 1 else 1))


@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("zero", [0, 1, 2])
def test_zero_dp_traffic_per_step(zero: int, m: int) -> None:
    layout = Layout(dp=DP, zero=zero, microbatches=m)
    job, e = _evaluate(DENSE, layout)
    p = stage_params(job, layout)
    # ZeRO-0 one all-reduce, ZeRO-1 one reduce-scatter, ZeRO-2 one per micro-batch
    assert e.comm_bytes["dp"] == pytest.approx(2 * p * (m if zero == 2 else 1))
    # ZeRO-1/2 gather the updated parameters once per step
    assert e.comm_bytes["zero"] == pytest.approx(2 * p if zero else 0.0)


def test_zero3_traffic_is_per_micro_batch() -> None:
    one = _evaluate(DENSE, Layout(dp=DP, zero=3, microbatches=1))[1].comm_bytes
    eight = _evaluate(DENSE, Layout(dp=DP, zero=3, microbatches=8))[1].comm_bytes
    assert eight["dp"] == pytest.approx(8 * one["dp"])
    assert eight["zero"] == pytest.approx(8 * one["zero"])


def test_only_zero2_and_3_pay_the_reduction_per_micro_batch_in_time() -> None:
    def dp_s(zero: int, m: int) -> float:
        return _evaluate(DENSE, Layout(dp=DP, zero=zero, microbatches=m))[1].time.dp_s

    assert dp_s(1, 1) > 0 and dp_s(1, 8) == pytest.approx(dp_s(1, 1))
    assert dp_s(2, 1) > 0 and dp_s(2, 8) == pytest.approx(8 * dp_s(2, 1))
    zero_s = [
        _evaluate(DENSE, Layout(dp=DP, zero=3, microbatches=m))[1].time.zero_s for m in (1, 8)
    ]
    assert zero_s[1] == pytest.approx(8 * zero_s[0])
    # ZeRO-1 and ZeRO-2 gather the updated parameters once per step, whatever m
    gathers = [
        _evaluate(DENSE, Layout(dp=DP, zero=1, microbatches=m))[1].time.zero_s for m in (1, 8)
    ]
    assert gathers[0] > 0 and gathers[1] == pytest.approx(gathers[0])


def _expert_optimizer_bytes(dp: int, ep: int) -> tuple[float, float]:
    """ZeRO-1's optimizer state of one GPU, and its expert parameters."""
    layout = Layout(dp=dp, ep=ep, zero=1)
    job, e = _evaluate(MOE, layout)
    p, experts = stage_params(job, layout), stage_expert_params(job, layout)
    dense = p - experts
    assert e.memory.optimizer == pytest.approx(12 * (dense / dp + experts / (dp // ep)))
    return e.memory.optimizer - 12 * dense / dp, experts


def test_expert_state_is_not_sharded_when_each_expert_has_one_replica() -> None:
    expert_state, experts = _expert_optimizer_bytes(8, 8)
    assert experts > 0 and expert_state == pytest.approx(12 * experts)


def test_expert_state_is_halved_over_two_replicas() -> None:
    one, experts = _expert_optimizer_bytes(8, 8)
    two, same = _expert_optimizer_bytes(16, 8)
    assert same == pytest.approx(experts) and two == pytest.approx(one / 2)


def test_expert_gradients_reduce_only_over_their_replicas() -> None:
    layout = Layout(dp=8, ep=8, zero=1)
    job, e = _evaluate(MOE, layout)
    dense = stage_params(job, layout) - stage_expert_params(job, layout)
    assert e.comm_bytes["dp"] == pytest.approx(2 * dense)


@pytest.mark.parametrize(
    ("zero", "pp", "noted"), [(2, 2, True), (3, 2, True), (1, 2, False), (2, 1, False)]
)
def test_zero2_with_a_pipeline_carries_the_pipeline_engine_reason(
    zero: int, pp: int, noted: bool
) -> None:
    layout = Layout(dp=4, pp=pp, zero=zero, microbatches=8)
    plan = make_plan(Job(DENSE, 32, 1), _cluster(layout.world), [layout])
    (e,) = plan.evaluated
    assert (PIPELINE_ENGINE_NOTE in e.notes) is noted
    zero_reason = next(r for r in plan.reasons if r.dimension == "zero")
    assert (PIPELINE_ENGINE_NOTE in zero_reason.why) is noted


def test_sequence_parallel_off_keeps_the_activations_whole_over_tp() -> None:
    def activations(flag: str) -> str:
        args = ["plan", "--model", "llama3-70b", "--gpus", "8", "--layout", "tp=8"]
        out = CliRunner().invoke(main, [*args, "--sequence-parallel", flag]).output
        return next(line for line in out.splitlines() if "memory/GPU  params" in line)

    assert activations("auto") == activations("on")
    assert "activations 23.0 GB" in activations("on")
    assert "activations 60.6 GB" in activations("off")
