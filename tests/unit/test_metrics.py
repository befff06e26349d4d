"""diag.numeric.intervals and diag.metrics, pinned on hand-computed numbers
(tests/data/dp2-golden)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diag.contract import ledger
from diag.metrics import compute_metrics
from diag.numeric import intervals
from diag.outputs.report import build_report
from diag.read.load import load_run

approx = pytest.approx

# --- intervals ------------------------------------------------------------------------------------


def test_union_length_counts_overlaps_once() -> None:
    assert intervals.union_length([(0, 10), (5, 20), (30, 40)]) == 30
    assert intervals.union_length([(0, 10), (10, 20)]) == 20
    assert intervals.union_length([(5, 5), (7, 3)]) == 0
    assert intervals.union_length([]) == 0


def test_merge_and_clip() -> None:
    assert intervals.merge([(5, 20), (0, 10), (30, 40)]).tolist() == [[0, 20], [30, 40]]
    assert intervals.clip([(0, 10), (15, 30), (40, 50)], 5, 20).tolist() == [[5, 10], [15, 20]]


def test_subtract() -> None:
    assert intervals.subtract([(0, 10), (5, 20)], [(8, 12)]) == 16
    assert intervals.subtract([(0, 10)], [(0, 10), (20, 30)]) == 0
    assert intervals.subtract([(0, 10)], []) == 10


def test_union_length_by_matches_the_plain_union_on_random_data() -> None:
    rng = np.random.default_rng(7)
    starts = rng.integers(0, 1000, 400)
    frame = pd.DataFrame({
        "rank": rng.integers(0, 4, 400),
        "step": rng.integers(0, 5, 400),
        "t0": starts + 10**18,
        "t1": starts + rng.integers(-5, 80, 400) + 10**18,
    })  # fmt: skip
    measured = intervals.union_length_by(frame, ["rank", "step"])
    for (rank, step), group in frame.groupby(["rank", "step"]):
        expected = intervals.union_length(group[["t0", "t1"]].to_numpy())
        assert measured.loc[(rank, step)] == expected


@pytest.mark.parametrize("keys", [["rank"], ["rank", "step"]])
def test_union_length_by_numpy_and_pandas_paths_agree(keys: list[str]) -> None:
    rng = np.random.default_rng(11)
    n = 2000
    starts = rng.integers(0, 10_000, n) + 1_700_000_000_000_000_000
    frame = pd.DataFrame({
        "rank": rng.integers(0, 64, n),
        "step": rng.integers(0, 9, n),
        "t0": starts,
        "t1": starts + rng.integers(-50, 900, n),  # some empty or reversed
    })  # fmt: skip
    fast = intervals.union_length_by(frame, keys)
    slow = intervals._union_length_by_frame(frame, keys, "t0", "t1")
    pd.testing.assert_series_equal(fast, slow, check_names=False)
    small = frame.assign(t0=frame["t0"] - starts.min(), t1=frame["t1"] - starts.min())
    as_float = small.astype({"t0": "float64", "t1": "float64"})  # not integers: pandas path
    assert intervals.union_length_by(as_float, keys).sum() == fast.sum()


def test_overlapping_matches_a_brute_force_check() -> None:
    rng = np.random.default_rng(3)
    base = 1_700_000_000_000_000_000

    def frame(n: int) -> pd.DataFrame:
        t0 = base + rng.integers(0, 50_000, n)
        return pd.DataFrame({"rank": rng.integers(0, 16, n), "t0": t0,
                             "t1": t0 + rng.integers(0, 400, n)})  # fmt: skip

    reference, rows = frame(300), frame(3000)
    mask = intervals.overlapping(reference, rows)
    for i, row in enumerate(rows.itertuples()):
        mine = reference[reference["rank"] == row.rank]
        expected = bool(((mine["t0"] < row.t1) & (mine["t1"] > row.t0)).any()) and row.t1 > row.t0
        assert mask[i] == expected, row
    assert 0 < mask.sum() < len(rows)
    assert not intervals.overlapping(reference.iloc[:0], rows).any()


def test_in_steps_selects_the_analysed_rank_steps() -> None:
    from diag.metrics import in_steps

    frame = pd.DataFrame({"rank": [0, 0, 1, 1, 2], "step": [0, 1, 0, 1, 1]})
    steps = pd.DataFrame({"rank": [0, 1], "step": [1, 0]})
    assert in_steps(frame, steps).tolist() == [False, True, True, False, False]
    assert not in_steps(frame, steps.iloc[:0]).any()


# --- the golden run: every number below is computed by hand from tests/data/dp2-golden -----------
# Step 0 is warm-up (each rank has 3 steps). Windows: rank 0 [100,200] [200,320] ms,
# rank 1 [100,210] [210,320] ms.
#   rank 0 step 1: compute [100,170]+[190,200]=80; wait = comm_wait [170,185]=15 (the all-reduce
#     is async); comm [150,185]=35; idle 100-80-15=5.
#   rank 0 step 2: blocking broadcast [200,205] + comm_wait [290,310] -> wait 25; compute
#     [205,290]+[305,320]=100, minus the 5 ms of opt inside the wait -> busy 95; comm 5+40=45.
#   rank 1 step 1: compute [100,180]+[195,210]=95; wait 15; comm 35; idle 0.
#   rank 1 step 2: broadcast [205,215] clipped to [210,215]; wait 5+22=27; comm 5+42=47;
#     compute [218,290]+[312,320]=80; idle 110-80-27=3.

GOLDEN_RANK_STEPS = [  # rank, step, wall, busy, comm, exposed, idle (ms)
    (0, 1, 100, 80, 35, 15, 5),
    (0, 2, 120, 95, 45, 25, 0),
    (1, 1, 110, 95, 35, 15, 0),
    (1, 2, 110, 80, 47, 27, 3),
]


@pytest.fixture
def golden(golden_dp2: Path):
    return compute_metrics(load_run(golden_dp2))


def test_golden_rank_steps(golden) -> None:
    got = golden.rank_steps
    cols = ["wall_s", "busy_s", "comm_s", "exposed_comm_s", "idle_s"]
    for rank, step, *ms in GOLDEN_RANK_STEPS:
        row = got[(got["rank"] == rank) & (got["step"] == step)].iloc[0]
        assert [row[c] for c in cols] == approx([v / 1000 for v in ms], abs=1e-12)
    for _, row in got.iterrows():
        assert row["busy_s"] + row["exposed_comm_s"] + row["idle_s"] == approx(row["wall_s"])
        assert row["comm_s"] >= row["exposed_comm_s"]


def test_golden_ranks_table(golden) -> None:
    ranks = golden.ranks.set_index("rank")
    assert ranks.loc[0, "host"] == "node0" and ranks.loc[0, "steps"] == 2
    seconds = ["step_time_s", "busy_s", "comm_s", "exposed_comm_s", "idle_s"]
    assert ranks.loc[0, seconds].tolist() == approx([0.110, 0.175, 0.080, 0.040, 0.005])
    assert ranks.loc[1, seconds].tolist() == approx([0.110, 0.175, 0.082, 0.042, 0.003])
    fractions = ["busy_frac", "comm_share", "exposed_comm_share", "idle_frac"]
    assert ranks.loc[1, fractions].tolist() == approx([175 / 220, 82 / 220, 42 / 220, 3 / 220])


def test_golden_summary(golden) -> None:
    summary = dict(golden.summary)
    for key in ("exposed_skew_share", "exposed_transfer_share", "replay_error", "ideal_step_s"):
        summary.pop(key)  # the attribution's (tests/unit/test_whatif.py)
    assert summary.pop("host_checked") is False  # this hand-made run records no CPU time
    assert summary == {
        "step_time_s": approx(0.115),  # mean of step 1 [100,210] and step 2 [200,320]
        "step_time_median_s": approx(0.115),
        "job_step_time_s": approx(0.115),
        # each rank's own step: 100, 120 (rank 0), 110, 110 (rank 1) ms
        "rank_step_time_s": approx(0.110),
        "tokens_per_s_rank_step": approx(4000 / 0.220),
        "first_step_analysed": 1,
        "last_step_analysed": 2,
        "status": "completed",
        "status_reason": "the manifest says complete and nothing was left open",
        "failed_step": None,
        "tokens_per_s": approx(4000 / 0.230),  # 2 ranks x 2 steps x 1000 tokens, dp only
        "comm_share": approx(162 / 440),
        "exposed_comm_share": approx(82 / 440),
        "hidden_comm_share": approx((162 - 82) / 162),
        "busy_imbalance": approx(1.0),
        "bubble_theory": None,
        "bubble_fraction": None,
        "steps_analysed": 2,
        "ranks_analysed": 2,
        "world_size": 2,
        "warmup_steps_excluded": 1,
        "loss_last": approx((1.25 + 1.0) / 2),
        # MFU (diag/metrics/flops.py): 6 N + 12 L h s FLOPs a token, no peak known for a CPU
        "active_params": 114688,
        "model_flops_per_token": approx(6 * 114688 + 12 * 2 * 64 * 32),  # L 2, h 64, s 32
        "model_tflops_per_gpu": approx(737280 * (4000 / 0.230) / 2 / 1e12),
        "peak_tflops_per_gpu": None,
        "mfu": None,
        "mfu_note": "no peak known for device 'cpu' (CPU or unknown); give --peak-tflops",
    }
    assert golden.skipped == []


def test_golden_collectives(golden) -> None:
    rows = {r["op"]: r for r in golden.collectives.to_dict("records")}
    allreduce = rows["all_reduce"]
    assert (allreduce["group"], allreduce["tag"], allreduce["count"]) == ("dp", "grads", 2)
    assert allreduce["bytes"] == 7_600_000 and allreduce["bytes_per_step"] == 3_800_000
    assert allreduce["expected_bytes"] == 8_000_000 and allreduce["ratio"] == approx(0.95)
    assert allreduce["time_s"] == approx(0.076)  # rank 0: 35+40 ms, rank 1: 35+42 ms
    assert allreduce["group_size"] == 2
    # 4 x 3.8 MB in 152 ms, bus factor 2(n-1)/n = 1 for n = 2
    assert allreduce["busbw_GBps"] == approx(0.1)
    broadcast = rows["broadcast"]
    assert pd.isna(broadcast["tag"]) and broadcast["count"] == 1
    assert broadcast["bytes"] == 1_500_000 and broadcast["bytes_per_step"] == 750_000
    assert pd.isna(broadcast["expected_bytes"]) and pd.isna(broadcast["ratio"])
    assert broadcast["time_s"] == approx(0.0075)  # 5 and 10 ms, unclipped
    assert broadcast["busbw_GBps"] == approx(3e6 / 0.015 / 1e9)
    assert list(golden.collectives["op"]) == ["all_reduce", "broadcast"]  # most time first


def test_golden_memory_keeps_nulls(golden) -> None:
    mib = 1024**2
    memory = golden.memory.set_index("rank")
    assert memory.loc[0, "activations"] == 3 * mib and memory.loc[1, "activations"] == 3.5 * mib
    assert memory.loc[1, "host_rss"] == 120 * mib and memory.loc[0, "params"] == 4 * mib
    assert memory["fragmentation"].isna().all() and memory["device_peak"].isna().all()
    assert len(golden.memory_steps) == 6
    report = build_report(load_run(Path(__file__).parents[1] / "data" / "dp2-golden"), golden)
    assert report["memory"][0]["fragmentation"] is None


def test_metrics_are_pure(golden_dp2: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(golden_dp2, copy)
    run = load_run(copy)
    shutil.rmtree(copy)
    assert compute_metrics(run).summary["steps_analysed"] == 2


# --- built runs ---------------------------------------------------------------------------------


def test_blocking_defaults(runs) -> None:
    """blocking when recorded; otherwise blocking unless async is true."""
    rows = [
        runs.comm(0, 0, 10),  # neither field: blocking
        runs.comm(0, 10, 20, **{"async": True}),  # async: hidden
        runs.comm(0, 20, 30, **{"async": True, "blocking": True}),  # waited for anyway
        runs.comm(0, 30, 40, **{"async": False, "blocking": False}),
        runs.step(0, 0, 100),
    ]
    m = compute_metrics(load_run(runs.write({0: rows}, runs.manifest(1))))
    assert m.ranks.loc[0, "exposed_comm_s"] == approx(0.020)
    assert m.ranks.loc[0, "comm_s"] == approx(0.040)
    assert m.ranks.loc[0, "idle_s"] == approx(0.080)


def test_fewer_than_three_steps_keep_the_first(runs) -> None:
    m = compute_metrics(load_run(runs.write({0: runs.simple_rank(2)}, runs.manifest(1))))
    assert m.summary["warmup_steps_excluded"] == 0 and m.summary["steps_analysed"] == 2
    assert m.ranks.loc[0, "busy_frac"] == approx(1.0)


def test_records_of_steps_without_a_step_record_are_noted(runs) -> None:
    rows = [*runs.simple_rank(3), runs.span(3, "fwd", 300, 350), runs.comm(3, 340, 360)]
    m = compute_metrics(load_run(runs.write({0: rows}, runs.manifest(1))))
    assert m.skipped == [
        "rank-00000.jsonl: 2 span/comm records of steps without a step record ignored (steps 3)"
    ]
    assert m.summary["steps_analysed"] == 2


def test_pipeline_bubble_and_tokens(runs) -> None:
    """pp=2, m=2: stage 1 idles 40% of each step; tokens are counted once per replica."""
    stage0 = [runs.span(s, "fwd", 100 * s, 100 * s + 100) for s in range(3)]
    stage1 = [runs.span(s, "fwd", 100 * s + 40, 100 * s + 100) for s in range(3)]
    records = {
        r: [*spans, *(runs.step(s, 100 * s, 100 * s + 100, tokens=500) for s in range(3))]
        for r, spans in ((0, stage0), (1, stage1))
    }
    manifest = runs.manifest(2, layout={"dp": 1, "pp": 2, "microbatches": 2})
    m = compute_metrics(load_run(runs.write(records, manifest)))
    assert m.summary["bubble_theory"] == approx(ledger.bubble_fraction(2, 2)) == approx(1 / 3)
    assert m.summary["bubble_fraction"] == approx((0 + 0.4) / 2)
    assert m.summary["tokens_per_s"] == approx(2 * 2 * 500 / 2 / 0.2)
    assert m.summary["busy_imbalance"] == approx(0.2 / 0.16)


def test_experts_table(runs) -> None:
    rows = [
        *runs.simple_rank(3),
        runs.experts(0, 0, [100, 100, 100, 100]),  # warm-up: ignored
        runs.experts(1, 0, [30, 10, 0, 0], dropped=4),
        runs.experts(2, 0, [30, 10, 0, 0], dropped=4),
        runs.experts(1, 1, [5, 5, 5, 5]),
    ]
    m = compute_metrics(load_run(runs.write({0: rows}, runs.manifest(1))))
    layer0, layer1 = m.experts.to_dict("records")
    assert layer0["tokens_per_expert"] == [60, 20, 0, 0] and layer0["tokens"] == 80
    assert layer0["load_cv"] == approx(np.std([60, 20, 0, 0]) / 20)
    assert layer0["max_over_mean"] == approx(3.0)
    assert layer0["drop_rate"] == approx(8 / 80)
    assert (layer0["dead_experts"], layer0["steps"], layer0["experts"]) == (2, 2, 4)
    assert layer1["load_cv"] == approx(0.0) and pd.isna(layer1["drop_rate"])


def test_loss_last_skips_nan(runs) -> None:
    rank0 = [runs.step(0, 0, 10, loss=3.0), runs.step(1, 10, 20, loss=float("nan"))]
    rank1 = [runs.step(0, 0, 10, loss=5.0), runs.step(1, 10, 20, loss=4.0)]
    m = compute_metrics(load_run(runs.write({0: rank0, 1: rank1})))
    assert m.summary["loss_last"] == approx(3.5)


def test_a_run_without_step_records_gives_empty_metrics(runs) -> None:
    run = load_run(runs.write({0: [runs.span(0, "fwd", 0, 10), runs.mem(0)]}, runs.manifest(1)))
    m = compute_metrics(run)
    assert m.ranks.empty and m.collectives.empty and m.experts.empty
    assert m.summary["step_time_s"] is None and m.summary["tokens_per_s"] is None
    assert m.summary["steps_analysed"] == 0
    assert m.skipped[0] == "no step records in any rank file: no step could be analysed"
    assert len(m.memory) == 1
    assert build_report(run, m)["summary"]["comm_share"] is None


def test_covered_before_is_the_union_clipped_to_the_left_of_each_time() -> None:
    union = intervals.merge(np.array([[0, 10], [5, 20], [30, 40], [50, 55]]))
    times = np.array([-5, 0, 7, 20, 25, 35, 40, 52, 60])
    expected = [intervals.union_length(intervals.clip(union, -10, t)) for t in times]
    assert intervals.covered_before(union, times).tolist() == expected
    assert intervals.covered_before(np.zeros((0, 2)), times).tolist() == [0] * len(times)
