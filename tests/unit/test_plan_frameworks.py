"""`diag plan --framework` (issue 29): what each framework keeps per parameter at each ZeRO
stage, the fp32 gradient buffers shown in grads, the runtime reserve in fragmentation, and
what each framework refuses (docs/plan.md, "Frameworks")."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from diag.cli.main import main
from diag.plan import FRAMEWORKS, GENERIC, Cluster, Framework, Job, Layout, make_plan
from diag.plan.evaluate import PIPELINE_ENGINE_NOTE, evaluate
from diag.plan.frameworks import (
    DEEPSPEED_PIPELINE,
    FP32_REDUCE_BUCKET_BYTES,
    MEGATRON_FP16,
    RUNTIME_RESERVE_BYTES,
    ZERO2_BUCKET_BYTES,
)
from diag.plan.memory import FRAGMENTATION_SHARE, stage_params
from simulator.config import ModelSpec
from simulator.hardware import HardwareSpec

DENSE = ModelSpec(layers=8, hidden=4096, heads=32, seq_len=2048, vocab=50304)
DP, M = 8, 8

# (framework, zero, pp) -> bytes per parameter of the heaviest stage's parameters P, as
# (params, grads, of which fp32, optimizer), each (whole, sharded over dp); buckets apart.
KEPT = [
    ("generic", 0, 1, (2, 0), (2, 0), (0, 0), (12, 0)),
    ("generic", 1, 1, (2, 0), (2, 0), (0, 0), (0, 12)),
    ("generic", 3, 1, (0, 2), (0, 2), (0, 0), (0, 12)),
    # Megatron-LM docs/distrib_optimizer.md: bf16 param, fp32 grads: 18, or 6 + 12/d
    ("megatron", 0, 1, (2, 0), (4, 0), (4, 0), (12, 0)),
    ("megatron", 1, 2, (2, 0), (4, 0), (4, 0), (0, 12)),
    ("nemo", 1, 1, (2, 0), (4, 0), (4, 0), (0, 12)),
    # DeepSpeed's BF16_Optimizer (ZeRO 0-1): bf16 grads and the full fp32 gradients
    ("deepspeed", 0, 1, (2, 0), (6, 0), (4, 0), (12, 0)),
    ("deepspeed", 1, 2, (2, 0), (6, 0), (4, 0), (0, 12)),
    ("deepspeed", 3, 1, (0, 2), (0, 6), (0, 4), (0, 12)),
    # FSDP, bf16 compute, fp32 reduce: the fp32 shards are the master weights
    ("fsdp", 0, 1, (4, 0), (4, 0), (4, 0), (8, 0)),
    ("fsdp", 2, 1, (2, 4), (0, 4), (0, 4), (0, 8)),
    ("fsdp", 3, 1, (0, 4), (0, 4), (0, 4), (0, 8)),
    ("torchtitan", 3, 1, (0, 4), (0, 4), (0, 4), (0, 8)),
    # under a pipeline schedule FSDP2 accumulates the unsharded gradients in fp32
    ("torchtitan", 2, 2, (2, 4), (4, 4), (4, 4), (0, 8)),
    ("torchtitan", 3, 2, (0, 4), (4, 4), (4, 4), (0, 8)),
]


def _framework(key: str) -> Framework:
    return GENERIC if key == "generic" else FRAMEWORKS[key]


def _cluster(gpus: int) -> Cluster:
    return Cluster(gpus, 1, HardwareSpec())


def _layout(zero: int, pp: int) -> Layout:
    return Layout(dp=DP, pp=pp, zero=zero, microbatches=M)


@pytest.mark.parametrize(("key", "zero", "pp", "params", "grads", "fp32", "optimizer"), KEPT)
def test_what_each_framework_keeps_per_parameter(
    key: str,
    zero: int,
    pp: int,
    params: tuple[float, float],
    grads: tuple[float, float],
    fp32: tuple[float, float],
    optimizer: tuple[float, float],
) -> None:
    layout = _layout(zero, pp)
    job = Job(DENSE, DP * M, framework=_framework(key))
    memory = evaluate(job, layout, _cluster(layout.world)).memory
    p = stage_params(job, layout)

    def bytes_of(per: tuple[float, float]) -> float:
        return p * (per[0] + per[1] / DP)

    assert memory.params == pytest.approx(bytes_of(params))
    assert memory.grads == pytest.approx(bytes_of(grads))
    assert memory.fp32_grads == pytest.approx(bytes_of(fp32))
    assert memory.optimizer == pytest.approx(bytes_of(optimizer))


def test_megatron_keeps_what_its_documentation_says() -> None:
    """18 B/param, 6 + 12/d with the distributed optimizer: the fp32 main grads are the buffer
    DDP reduces from, so no flat bf16 buffer beside them."""
    for zero, per_param in ((0, 18), (1, 6 + 12 / DP)):
        layout = _layout(zero, 1)
        job = Job(DENSE, DP * M, framework=FRAMEWORKS["megatron"])
        memory = evaluate(job, layout, _cluster(DP)).memory
        assert memory.static_bytes == pytest.approx(per_param * stage_params(job, layout))
        assert memory.comm_buffers == 0.0


def test_megatron_in_fp16_keeps_its_documented_row() -> None:
    """The distrib_optimizer table's fp16 row: 20 B/param, 4 + 16/d; the reduction in fp16."""
    for zero, per_param in ((0, 20), (1, 4 + 16 / DP)):
        layout = _layout(zero, 1)
        job = Job(DENSE, DP * M, framework=MEGATRON_FP16)
        e = evaluate(job, layout, _cluster(DP))
        p = stage_params(job, layout)
        assert e.memory.static_bytes == pytest.approx(per_param * p)
        assert e.comm_bytes["dp"] == pytest.approx(2 * p)


def test_deepspeed_reduces_through_an_fp32_bucket() -> None:
    layout = _layout(1, 1)
    job = Job(DENSE, DP * M, framework=FRAMEWORKS["deepspeed"])
    memory = evaluate(job, layout, _cluster(DP)).memory
    assert memory.comm_buffers == pytest.approx(
        min(4 * stage_params(job, layout), FP32_REDUCE_BUCKET_BYTES)
    )
    zero2 = evaluate(job, _layout(2, 1), _cluster(DP)).memory
    p = stage_params(job, _layout(2, 1))
    assert zero2.grads == pytest.approx(6 * p / DP + min(2 * p, ZERO2_BUCKET_BYTES))


@pytest.mark.parametrize("key", sorted(FRAMEWORKS))
def test_the_reserve_is_in_fragmentation(key: str) -> None:
    layout = _layout(0, 1)
    job = Job(DENSE, DP * M, framework=FRAMEWORKS[key])
    memory = evaluate(job, layout, _cluster(DP)).memory
    allocated = memory.total_bytes - memory.fragmentation
    assert memory.reserve == RUNTIME_RESERVE_BYTES
    assert memory.fragmentation == pytest.approx(
        allocated * FRAGMENTATION_SHARE + RUNTIME_RESERVE_BYTES
    )


def test_no_framework_is_the_plan_as_it_was() -> None:
    """GENERIC: 2 + 2 + 12 B/param, DDP's bf16 flat buffer, 5% fragmentation, no reserve."""
    layout = _layout(1, 1)
    job = Job(DENSE, DP * M)
    memory = evaluate(job, layout, _cluster(DP)).memory
    p = stage_params(job, layout)
    assert (memory.fp32_grads, memory.reserve) == (0.0, 0.0)
    assert memory.comm_buffers == pytest.approx(2 * p)
    allocated = memory.total_bytes - memory.fragmentation
    assert memory.fragmentation == pytest.approx(allocated * FRAGMENTATION_SHARE)


def test_deepspeed_refuses_zero_2_with_a_pipeline_as_a_rejection() -> None:
    layout = _layout(2, 2)
    generic = evaluate(Job(DENSE, DP * M), layout, _cluster(layout.world))
    assert generic.feasible and generic.notes == (PIPELINE_ENGINE_NOTE,)
    job = Job(DENSE, DP * M, framework=FRAMEWORKS["deepspeed"])
    refused = evaluate(job, layout, _cluster(layout.world))
    assert refused.rejected == DEEPSPEED_PIPELINE and refused.rejected_kind == "framework"
    assert refused.notes == ()
    assert evaluate(job, _layout(1, 2), _cluster(layout.world)).feasible


@pytest.mark.parametrize(
    ("key", "layout", "why"),
    [
        ("megatron", Layout(dp=8, zero=3), "megatron runs ZeRO 0, 1, not 3"),
        ("fsdp", Layout(dp=4, pp=2, microbatches=4), "fsdp has no pipeline schedule"),
        ("deepspeed", Layout(dp=2, pp=4, microbatches=4, v=2), "no interleaved pipeline"),
        ("fsdp", Layout(dp=4, cp=2), "fsdp has no context parallelism"),
        ("deepspeed", Layout(dp=8, recompute="selective"), "offers recomputation none, full"),
    ],
)
def test_a_layout_the_framework_cannot_run_is_rejected_with_its_reason(
    key: str, layout: Layout, why: str
) -> None:
    job = Job(DENSE, layout.dp * layout.microbatches, framework=FRAMEWORKS[key])
    e = evaluate(job, layout, _cluster(layout.world))
    assert e.rejected_kind == "framework"
    assert e.rejected is not None and why in e.rejected


def test_the_zero_reason_names_deepspeeds_refusal() -> None:
    """Under deepspeed, ZeRO-2 beside the chosen ZeRO-1 pipeline is refused, and the ZeRO
    reason says why (without a framework it is a note)."""
    layouts = [Layout(dp=4, pp=2, zero=zero, microbatches=16) for zero in (1, 2)]
    job = Job(DENSE, 64, framework=FRAMEWORKS["deepspeed"])
    plan = make_plan(job, _cluster(8), layouts)
    assert plan.best is not None and plan.best.layout.zero == 1
    zero = next(r for r in plan.reasons if r.dimension == "zero")
    assert f"zero=2: {DEEPSPEED_PIPELINE}" in zero.why
    assert any(e.rejected_kind == "framework" for e, _ in plan.misses)


def test_a_deepspeed_search_runs_only_what_deepspeed_runs() -> None:
    job = Job(DENSE, 64, framework=FRAMEWORKS["deepspeed"])
    plan = make_plan(job, Cluster(16, 8, HardwareSpec()))
    assert all(e.layout.zero < 2 or e.layout.pp == 1 for e in plan.ranked)
    assert all(e.layout.v == 1 and e.layout.cp == 1 for e in plan.evaluated)
    assert all(e.layout.recompute != "selective" for e in plan.evaluated)
    refused = [e for e in plan.evaluated if e.rejected_kind == "framework"]
    assert refused and all(e.rejected == DEEPSPEED_PIPELINE for e in refused)


def test_fsdp_searches_without_a_pipeline_or_sequence_parallelism() -> None:
    job = Job(DENSE, 64, framework=FRAMEWORKS["fsdp"])
    plan = make_plan(job, Cluster(16, 8, HardwareSpec()))
    assert plan.evaluated
    assert {e.layout.pp for e in plan.evaluated} == {1}
    assert not any(e.layout.sequence_parallel for e in plan.evaluated)
    assert {e.layout.zero for e in plan.evaluated} <= {0, 2, 3}


def test_the_json_names_the_framework_and_the_parts() -> None:
    args = ["plan", "--layers", "4", "--hidden", "512", "--heads", "8", "--seq", "512"]
    args += ["--gpus", "8", "--framework", "deepspeed", "--format", "json"]
    args += ["--layout", "dp=4,pp=2,zero=2,m=4", "--layout", "dp=4,pp=2,zero=1,m=4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["job"]["framework"] == "deepspeed"
    refused, kept = doc["layouts"]
    assert refused["rejected_kind"] == "framework"
    assert kept["rejected"] is None and kept["rejected_kind"] is None
    # the six categories and the total, as before; the framework's parts beside them
    assert list(kept["memory_bytes"]) == [
        "params", "grads", "optimizer", "activations", "comm_buffers", "fragmentation", "total"
    ]  # fmt: skip
    assert kept["memory_parts_bytes"]["reserve"] == RUNTIME_RESERVE_BYTES
    assert 0 < kept["memory_parts_bytes"]["fp32_grads"] < kept["memory_bytes"]["grads"]


def test_the_text_shows_the_parts_in_their_categories() -> None:
    args = ["plan", "--layers", "4", "--hidden", "512", "--heads", "8", "--seq", "512"]
    args += ["--gpus", "8", "--framework", "megatron", "--layout", "dp=8,zero=1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "framework  megatron" in result.stdout
    assert "(fp32 " in result.stdout and "(reserve 2.0 GB)" in result.stdout


@pytest.mark.parametrize(
    ("key", "zero", "pp", "reductions", "bytes_per_param"),
    [
        ("generic", 1, 1, 1, 2),
        ("generic", 2, 2, M, 2),
        ("megatron", 1, 1, 1, 4),  # the fp32 main grads are what it reduces
        ("deepspeed", 1, 2, 1, 4),  # the bf16 optimizer all-reduces its fp32 gradients
        ("deepspeed", 2, 1, M, 2),  # ZeRO-2 reduce-scatters bf16 after every micro-batch
        ("fsdp", 3, 1, M, 4),  # reduce_dtype fp32
        ("torchtitan", 2, 1, M, 4),
        ("torchtitan", 2, 2, 1, 4),  # gradient sync off until the last micro-batch
    ],
)
def test_the_gradient_reduction_as_each_framework_runs_it(
    key: str, zero: int, pp: int, reductions: int, bytes_per_param: float
) -> None:
    layout = _layout(zero, pp)
    job = Job(DENSE, DP * M, framework=_framework(key))
    e = evaluate(job, layout, _cluster(layout.world))
    assert e.comm_bytes["dp"] == pytest.approx(
        reductions * bytes_per_param * stage_params(job, layout)
    )
