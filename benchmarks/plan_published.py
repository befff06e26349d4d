"""The published training configurations against `diag plan` (docs/plan.md, "Published
layouts"): for each job, its published layout's rank among the meshes of a full search and of
a search restricted to what its framework offered (`--framework` and the options of the
time), the predicted per-GPU TFLOP/s of that layout against the published figure, and its
predicted memory per GPU under its framework and without one.

    .venv/bin/python benchmarks/plan_published.py        # prints the table's markdown rows

The published figures are the papers' (cited in `SOURCE`); where a figure counts the
recomputed forward (Megatron's "% of peak") it is held against the plan's HFU, else its MFU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from diag.contract.devices import device_by_key
from diag.plan import (
    FRAMEWORKS,
    Job,
    Plan,
    SearchSpace,
    cluster_from_device,
    framework_space,
    make_plan,
)
from diag.plan.evaluate import Evaluation, evaluate
from diag.plan.frameworks import MEGATRON_FP16, Framework
from diag.plan.job import Training
from diag.plan.models import GPT_ERA, MODERN, preset
from simulator.config import ModelSpec


@dataclass(frozen=True)
class Published:
    name: str
    source: str
    model: ModelSpec
    training: Training
    device: str
    gpus: int
    batch: int
    mesh: tuple[int, int, int, int]  # tp, pp, dp, ep
    tflops: float  # per GPU, as published
    counts_recompute: bool  # the figure counts the recomputed forward (HFU)
    framework: SearchSpace  # what its framework offered
    memory_note: str = ""

    @property
    def framework_key(self) -> str:
        return FRAMEWORK_OF[self.framework][0]

    @property
    def runs_on(self) -> Framework:
        return FRAMEWORK_OF[self.framework][1]


MEGATRON, DEEPSPEED = FRAMEWORKS["megatron"], FRAMEWORKS["deepspeed"]
FSDP, TORCHTITAN = FRAMEWORKS["fsdp"], FRAMEWORKS["torchtitan"]
MEGATRON_2019 = framework_space(MEGATRON_FP16, zero_stages=(0,), recompute=("full",), max_cp=1,
                                max_v=1, pp=1, sequence_parallel=False)  # fmt: skip
MEGATRON_2021 = framework_space(MEGATRON_FP16, zero_stages=(0,), recompute=("full",), max_cp=1,
                                sequence_parallel=False)  # fmt: skip
DEEPSPEED_2022 = framework_space(DEEPSPEED, zero_stages=(0, 1), recompute=("full",),
                                 sequence_parallel=False)  # fmt: skip
FSDP_2022 = framework_space(FSDP, zero_stages=(3,), recompute=("full",))
LLAMA3 = framework_space(TORCHTITAN, zero_stages=(2, 3), max_cp=1)
"""Llama 3 (arXiv 2407.21783, 3.3.2): FSDP sharding optimizer state and gradients, the
parameters not resharded after forward (torchtitan's default under a pipeline): ZeRO-2."""
DEEPSEEK_V3 = framework_space(MEGATRON, zero_stages=(1,), recompute=("selective", "full"),
                              max_cp=1, tp=1)  # fmt: skip
"""DeepSeek-V3 recomputes its norms and MLA up-projections: between the plan's two kinds. Its
framework (HAI-LLM) is not public: Megatron's ZeRO-1 distributed optimizer and EP stand in."""
FRAMEWORK_OF = {
    MEGATRON_2019: ("megatron (fp16)", MEGATRON_FP16),
    MEGATRON_2021: ("megatron (fp16)", MEGATRON_FP16),
    DEEPSPEED_2022: ("deepspeed", DEEPSPEED),
    FSDP_2022: ("fsdp", FSDP),
    LLAMA3: ("torchtitan", TORCHTITAN),
    DEEPSEEK_V3: ("megatron", MEGATRON),
}
"""Each job's framework: Megatron-LM trained in fp16 before bf16 (frameworks.MEGATRON_FP16);
BLOOM in bf16 with DeepSpeed's bf16 optimizer; MT-NLG's precision is taken as bf16 too."""

JOBS = [
    Published(
        "Megatron-LM 8.3B",
        "Shoeybi et al. 2019, arXiv 1909.08053: 512 V100, 15.1 PFLOP/s",
        ModelSpec(layers=72, hidden=3072, heads=32, seq_len=1024, vocab=51200),
        GPT_ERA,
        "v100",
        512,
        512,
        (8, 1, 64, 1),
        15.1e15 / 512 / 1e12,
        True,
        MEGATRON_2019,
    ),
    Published(
        "GPT-3 175B",
        "Narayanan et al. 2021, arXiv 2104.04473, Table 1 (as recalled)",
        preset("gpt3-175b"),
        GPT_ERA,
        "a100",
        1024,
        1536,
        (8, 8, 16, 1),
        138,
        True,
        MEGATRON_2021,
    ),
    Published(
        "Megatron-LM 1T",
        "Narayanan et al. 2021, arXiv 2104.04473: 502 PFLOP/s on 3,072",
        preset("megatron-1t"),
        GPT_ERA,
        "a100",
        3072,
        3072,
        (8, 64, 6, 1),
        502e15 / 3072 / 1e12,
        True,
        MEGATRON_2021,
    ),
    Published(
        "MT-NLG 530B",
        "Smith et al. 2022, arXiv 2201.11990 (126 TFLOP/s as recalled)",
        preset("mt-nlg-530b"),
        GPT_ERA,
        "a100",
        2240,
        1920,
        (8, 35, 8, 1),
        126,
        True,
        DEEPSPEED_2022,
    ),
    Published(
        "BLOOM 176B",
        "BigScience 2022, arXiv 2211.05100 and its training notes: 384 A100, "
        "48 GPUs a replica, about 150 TFLOP/s, 60 GB a GPU",
        preset("bloom-176b"),
        Training(flash_attention=False, dropout=False),
        "a100",
        384,
        2048,
        (4, 12, 8, 1),
        150,
        True,
        DEEPSPEED_2022,
        "published 60 GB",
    ),
    Published(
        "OPT-175B",
        "Zhang et al. 2022, arXiv 2205.01068: 992 A100, FSDP + TP 8, 147 TFLOP/s",
        replace(preset("gpt3-175b"), vocab=50272),
        GPT_ERA,
        "a100",
        992,
        992,  # 2M tokens a batch: 992 sequences, a multiple of DP 124
        (8, 1, 124, 1),
        147,
        True,
        FSDP_2022,
    ),
    Published(
        "Llama 3.1 405B",
        "Llama 3, arXiv 2407.21783, Table 4: 16,384 H100, 400 TFLOP/s",
        preset("llama3-405b"),
        MODERN,
        "h100",
        16384,
        2048,
        (8, 16, 128, 1),
        400,
        False,
        LLAMA3,
    ),
    Published(
        "DeepSeek-V3 671B (MoE)",
        "DeepSeek-V3, arXiv 2412.19437: 2,048 H800, PP 16, EP 64 over "
        "8 nodes, ZeRO-1 DP; 180K GPU-hours per trillion tokens (MFU derived; shape "
        "approximated: 257 experts of 2048 incl. the shared one, top-9, no MLA)",
        ModelSpec(
            layers=61,
            hidden=7168,
            heads=128,
            ffn_hidden=2048,
            vocab=129280,
            seq_len=4096,
            experts=256,
            topk=9,
            gated_mlp=True,
            tied_embeddings=False,
            learned_positions=False,
        ),
        MODERN,
        "h100",
        2048,
        4096,
        (1, 16, 128, 64),
        1e12 / (180e3 * 3600) * 6 * 37e9 / 1e12,
        False,
        DEEPSEEK_V3,
    ),
]


def rank_of(meshes: list, mesh: tuple[int, int, int, int]) -> tuple[int | None, object]:
    for i, e in enumerate(meshes):
        lay = e.layout
        if (lay.tp, lay.pp, lay.dp, lay.ep) == mesh:
            return i + 1, e
    return None, None


def main() -> None:
    print("| job | framework | published layout | rank: full search / framework's | predicted "
          "vs published TFLOP/s per GPU | memory per GPU: framework's (none named) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for job in JOBS:
        started = time.perf_counter()
        cluster = cluster_from_device(device_by_key(job.device), job.gpus)
        work = Job(job.model, job.batch, 1, training=job.training)
        full = make_plan(work, cluster, space=SearchSpace(max_cp=1 if job.gpus > 4096 else 8))
        framed = replace(work, framework=job.runs_on)
        framework = make_plan(framed, cluster, space=job.framework)
        rank_full, _ = rank_of(full.meshes, job.mesh)
        rank_framework, evaluation = rank_of(framework.meshes, job.mesh)
        tp, pp, dp, ep = job.mesh
        layout = f"TP {tp} x PP {pp} x DP {dp}" + (f" x EP {ep}" if ep > 1 else "")
        if evaluation is None:
            evaluation = fastest_variant(framework, job.mesh)
        if evaluation is None:
            predicted, memory = "not buildable", ""
        else:
            share = evaluation.hfu if job.counts_recompute else evaluation.mfu
            tflops = share * cluster.peak_flops_per_s / 1e12
            predicted = f"{tflops:.0f} vs {job.tflops:.0f} ({tflops / job.tflops - 1:+.0%})"
            generic = evaluate(work, evaluation.layout, cluster).memory.total_bytes
            memory = f"{evaluation.memory.total_bytes / 1e9:.1f} GB ({generic / 1e9:.1f} GB)"
            memory += f", {job.memory_note}" if job.memory_note else ""
            if not evaluation.feasible:
                predicted += f"; rejected: {evaluation.rejected}"
        ranks = f"{rank_full or '-'} / {rank_framework or '-'} of {len(framework.meshes)}"
        cells = [job.name, job.framework_key, layout, ranks, predicted, memory]
        print(f"| {' | '.join(cells)} |  <!-- {time.perf_counter() - started:.0f} s -->",
              flush=True)  # fmt: skip


def fastest_variant(plan: Plan, mesh: tuple[int, int, int, int]) -> Evaluation | None:
    """The published mesh's fastest variant among every layout evaluated, feasible or not
    (when its framework's search finds none of them feasible: why not)."""
    same = [
        e for e in plan.evaluated if (e.layout.tp, e.layout.pp, e.layout.dp, e.layout.ep) == mesh
    ]
    return min(same, key=lambda e: (e.memory.total_bytes, e.step_s), default=None)


if __name__ == "__main__":
    main()
