"""The pipeline trainer (gloo): schedules, bubble against theory, activation memory,
PP x DP bytes and groups, injections.

Each run is launched once per module and shared by the tests that read it. The model is sized
so that a micro-batch's forward and backward on a stage (several ms) dwarf its send/recv (a
128 KiB message over loopback, ~0.1 ms): hidden 256, seq 64, micro-batch 4, vocabulary 128
(a small LM head keeps the last stage close to the others), one block per stage at p=4.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from diag.contract import ledger
from diag.metrics import RunMetrics, compute_metrics
from diag.read.load import RunData, load_run
from tests.distributed.conftest import diag_run

pytestmark = pytest.mark.dist

MODEL = ["--hidden", "256", "--seq", "64", "--micro-batch", "4", "--vocab", "128"]
BOUNDARY_BYTES = ledger.pp_boundary_bytes(4, 64, 256, 4)
RUNS: dict[str, tuple[int, list[str]]] = {  # name -> (ranks, trainer options)
    "1f1b-m8": (4, ["--layers", "4", "--steps", "4", "--microbatches", "8", "--schedule", "1f1b"]),
    "gpipe-m8": (4, ["--layers", "4", "--steps", "4", "--microbatches", "8", "--schedule",
                     "gpipe"]),
    "1f1b-m2": (4, ["--layers", "4", "--steps", "4", "--microbatches", "2", "--schedule", "1f1b"]),
    "p2-1f1b-m2": (2, ["--layers", "8", "--steps", "5", "--microbatches", "2", "--schedule",
                       "1f1b"]),
    "p2-interleaved-m2": (2, ["--layers", "8", "--steps", "5", "--microbatches", "2",
                              "--schedule", "interleaved", "--virtual-stages", "2"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[RunData, RunMetrics]]:
    """`pp_run(name)`: the run of RUNS[name] (launched on first use) and its metrics."""
    done: dict[str, tuple[RunData, RunMetrics]] = {}

    def get(name: str) -> tuple[RunData, RunMetrics]:
        if name not in done:
            nproc, args = RUNS[name]
            out = tmp_path_factory.mktemp(name)
            diag_run(out, *args, *MODEL, nproc=nproc, trainer="pp")
            run = load_run(out)
            done[name] = (run, compute_metrics(run))
        return done[name]

    return get


def _step_losses(run: RunData) -> list[float]:
    """Per-step loss of the last stage (the only one with a loss)."""
    steps = run.steps.dropna(subset=["loss"]).sort_values("step")
    assert steps["rank"].nunique() == 1
    return steps["loss"].tolist()


def test_1f1b_and_gpipe_give_the_same_loss(pp_run) -> None:
    one_f_one_b, gpipe = _step_losses(pp_run("1f1b-m8")[0]), _step_losses(pp_run("gpipe-m8")[0])
    assert len(one_f_one_b) == 4
    assert gpipe == pytest.approx(one_f_one_b, rel=1e-5)
    assert one_f_one_b[-1] < one_f_one_b[0]  # it trains


# Tolerances. The theory assumes every stage owns a processor and every stage's micro-batch
# takes the same time. Here 4 ranks share 2 cores: when 3 or 4 stages could compute at once only
# 2 run, and the others wait for a core or for a neighbour that waits for one, so in the steady
# phase a stage computes about half the time. The bubble of a long pipeline (m=8, theory 0.27)
# therefore sits well above theory: 0.32-0.46 measured, the top with other jobs on the machine.
# A short one (m=2, theory 0.60) is mostly fill and drain and stays near it: 0.55-0.66. Backward
# takes ~2x forward and the last stage also carries the LM head and the loss, which the theory
# ignores too (stage imbalance 1.1-1.2 here).
BUBBLE_TOLERANCE = {2: 0.12, 8: 0.25}


def test_bubble_shrinks_with_more_micro_batches_and_follows_theory(pp_run) -> None:
    measured = {}
    for m in (2, 8):
        run, metrics = pp_run(f"1f1b-m{m}")
        summary = metrics.summary
        assert summary["bubble_theory"] == pytest.approx(ledger.bubble_fraction(4, m))
        assert summary["bubble_fraction"] == pytest.approx(summary["bubble_theory"],
                                                           abs=BUBBLE_TOLERANCE[m])  # fmt: skip
        assert sorted(metrics.ranks["stage"]) == [0, 1, 2, 3]
        measured[m] = summary["bubble_fraction"]
        # one fwd and one bwd span per micro-batch on every stage, carrying stage and chunk
        spans = run.spans[run.spans["phase"].isin(["fwd", "bwd"])]
        per_step = spans.groupby(["rank", "step", "phase"]).size()
        assert (per_step == m).all() and len(per_step) == 4 * 4 * 2
        assert (spans["stage"] == spans["rank"]).all() and (spans["chunk"] == 0).all()
    assert measured[2] > measured[8] + 0.08  # theory: 0.33 apart


def test_gpipe_holds_all_micro_batches_1f1b_at_most_p(pp_run) -> None:
    def activations(name: str) -> list[float]:
        memory = pp_run(name)[1].memory.sort_values("rank")
        return memory["activations"].tolist()

    gpipe, one_f_one_b = activations("gpipe-m8"), activations("1f1b-m8")
    assert all(g > f for g, f in zip(gpipe, one_f_one_b, strict=True))
    assert max(gpipe) > 1.5 * max(one_f_one_b)
    # 1F1B: stage s keeps p - s = 4, 3, 2 micro-batches alive (the last stage 1, plus logits);
    # GPipe keeps all 8 on every stage.
    unit = one_f_one_b[2] / 2
    assert one_f_one_b[0] == pytest.approx(4 * unit, rel=0.05)
    assert one_f_one_b[1] == pytest.approx(3 * unit, rel=0.05)
    assert gpipe[1] == pytest.approx(8 * unit, rel=0.05)


def test_interleaved_has_a_smaller_bubble_than_1f1b(pp_run) -> None:
    # p=2 on 2 ranks, one core per stage, so the measurement can follow the theory: 1F1B 1/3,
    # interleaved v=2 1/5 at m=2. Measured on a quiet machine: 1F1B 0.29-0.32, interleaved
    # 0.21-0.28 (its twice as many, half as long actions pay the per-message overhead twice);
    # 0.02 of slack for a neighbouring job stealing a core. Its p2p traffic is three times
    # 1F1B's (4 model stages: 3 boundaries instead of 1), all between the same two ranks, so
    # the tags keep activations and gradients apart.
    run, interleaved = pp_run("p2-interleaved-m2")
    plain_run, plain = pp_run("p2-1f1b-m2")
    assert interleaved.summary["bubble_theory"] == pytest.approx(ledger.bubble_fraction(2, 2, 2))
    assert interleaved.summary["bubble_fraction"] < plain.summary["bubble_fraction"] + 0.02
    assert interleaved.summary["bubble_fraction"] == pytest.approx(0.2, abs=0.12)
    assert _step_losses(run) == pytest.approx(_step_losses(plain_run), rel=1e-5)
    sends = run.comms[(run.comms["op"] == "send") & (run.comms["step"] == 1)]
    assert len(sends) == 3 * 2 * 2  # 3 boundaries x (act + grad) x 2 micro-batches
    assert set(run.spans["chunk"].dropna()) == {0, 1}


def test_pp2_x_dp2_bytes_groups_and_injections(tmp_path: Path) -> None:
    """`diag run pp` with PP=2 x DP=2: send/recv bytes equal the ledger's boundary bytes, one
    recorded gradient all-reduce per step over dp, groups in the manifest; a straggler stage and
    a slow dp group show where they belong."""
    delay_ms, straggle_ms, m = 40, 40, 4  # 40 ms: 4 ranks on 2 cores stretch a 30 ms forward
    diag_run(tmp_path, "--pp", "2", "--dp", "2", "--layers", "4", "--steps", "3",
             "--microbatches", str(m), *MODEL, "--inject", f"slow-comm:ms={delay_ms},group=dp",
             "--inject", f"straggler:rank=1,ms={straggle_ms}", nproc=4, trainer="pp")  # fmt: skip
    run = load_run(tmp_path)
    manifest = run.manifest
    assert manifest.groups["pp"] == [[0, 1], [2, 3]] and manifest.groups["dp"] == [[0, 2], [1, 3]]
    assert (manifest.layout.pp, manifest.layout.dp, manifest.layout.microbatches) == (2, 2, m)

    p2p = run.comms[run.comms["op"].isin(["send", "recv"])]
    assert (p2p["group"] == "pp").all() and (p2p["bytes"] == BOUNDARY_BYTES).all()
    assert (p2p["expected_bytes"] == BOUNDARY_BYTES).all()
    per_step = p2p.groupby(["rank", "step", "op", "tag"]).size()
    assert (per_step == m).all()  # stage 0: m act sends, m grad recvs; stage 1 the mirror
    assert set(per_step.index.droplevel([1]).unique()) == {
        (0, "send", "act"), (0, "recv", "grad"), (2, "send", "act"), (2, "recv", "grad"),
        (1, "recv", "act"), (1, "send", "grad"), (3, "recv", "act"), (3, "send", "grad"),
    }  # fmt: skip

    grads = run.comms[run.comms["op"] == "all_reduce"]
    assert (grads["group"] == "dp").all() and (grads["tag"] == "grad").all()
    assert (grads.groupby(["rank", "step"]).size() == 1).all() and len(grads) == 4 * 3
    assert (grads["bytes"] == grads["expected_bytes"]).all()
    stage_bytes = grads.groupby("rank")["bytes"].first()
    assert stage_bytes[0] == stage_bytes[2] and stage_bytes[1] == stage_bytes[3]

    metrics = compute_metrics(run)
    ranks = metrics.ranks.set_index("rank")
    assert ranks["stage"].tolist() == [0, 1, 0, 1]
    for rank, row in ranks.iterrows():  # the dp delay is waited for inside the all-reduce
        assert row["exposed_comm_s"] / row["steps"] > 0.9 * delay_ms / 1e3, rank
    # The straggler sleeps inside each of its forward spans: they stand out against the same
    # stage's spans on the other replica (medians: other jobs on the 2 cores stretch any span).
    fwd = run.spans[run.spans["phase"] == "fwd"]
    fwd_s = (fwd["t1"] - fwd["t0"]) / 1e9
    assert (fwd_s[fwd["rank"] == 1] >= straggle_ms / 1e3).all()
    medians = fwd_s.groupby(fwd["rank"]).median()
    assert medians[1] > medians[3] + 0.5 * straggle_ms / 1e3
    assert metrics.summary["stage_imbalance"] >= 1.0
