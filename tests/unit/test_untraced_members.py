"""A trace folder that lacks a rank's file: its peers' waiting for it inside their collectives
is read as waiting for it, not as transfer (diag/whatif/late_members.py). Before, a dp=4 x
tp=2 job whose straggler's trace was missing named nobody (its cost went nowhere), and a dp=8
job's read "communication not hidden, 32% of the step" with no word that the transfer might
be waiting for the rank with no trace."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diag.api import analyze_path

STRAGGLER = 3
LAST_STAGE = (3, 7)  # dp=2 x pp=4: the ranks of stage 3


def _simulated(root: Path, name: str, layout: str, inject: list[str], *more: str) -> Path:
    out = root / name
    args = ["--layout", layout, "--steps", "6", "--format", "kineto", *inject, *more,
            "--out", str(out)]  # fmt: skip
    subprocess.run([sys.executable, "-m", "diag", "simulate", *args], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    return out


def _without(folder: Path, rank: int | tuple[int, ...], into: Path) -> Path:
    """A copy of the trace folder without the files of `rank` (as a lost node's traces are)."""
    ranks = {rank} if isinstance(rank, int) else set(rank)
    shutil.copytree(folder, into)
    removed = set()
    for path in into.glob("*.json"):
        found = json.loads(path.read_text()).get("distributedInfo", {}).get("rank")
        if found in ranks:
            path.unlink()
            removed.add(found)
    assert removed == ranks, f"no trace of ranks {ranks - removed} in {folder}"
    return into


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("untraced")
    slow = ["--inject", f"straggler:rank={STRAGGLER},ms=30"]
    two_groups = _simulated(root, "dp4tp2", "dp=4,tp=2", slow)
    one_group = _simulated(root, "dp8", "dp=8", slow)
    healthy = _simulated(root, "healthy", "dp=4,tp=2", [])
    stage = _simulated(root, "dp2pp4", "dp=2,pp=4", ["--inject", "stage-slow:stage=3,ms=20"],
                       "-m", "8", "--trace-shape", "megatron")  # fmt: skip
    stage_dm = _simulated(root, "dp2pp4-dm", "dp=2,pp=4", ["--inject", "stage-slow:stage=3,ms=20"],
                          "-m", "8")  # fmt: skip
    return {
        "stage": stage,
        "stage-part": _without(stage, LAST_STAGE, root / "dp2pp4-part"),
        "stage-before-lost": _without(stage, 2, root / "dp2pp4-no-2"),
        "stage-dm-before-lost": _without(stage_dm, 2, root / "dp2pp4-dm-no-2"),
        "two-groups": two_groups,
        "two-groups-part": _without(two_groups, STRAGGLER, root / "dp4tp2-part"),
        "one-group-part": _without(one_group, STRAGGLER, root / "dp8-part"),
        # one rank per TP group traced (the even ones): rank 2 stands for its partner 3
        "one-per-tp": _without(two_groups, (1, 3, 5, 7), root / "dp4tp2-one-per-tp"),
        "healthy-part": _without(healthy, STRAGGLER, root / "healthy-part"),
        # the straggler traced, its TP partner not (the partner's data-parallel all-reduces
        # read from the straggler's, its lockstep stand-in)
        "partner-part": _without(two_groups, STRAGGLER - 1, root / "dp4tp2-partner-part"),
    }


PIPELINE_STRAGGLER = 10  # dp2 x tp2 x pp4: dp 1, stage 1, first of its TP group


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dp2 x tp2 x pp4 job (1F1B, m=8) with a straggler, whole and with one file lost: the
    straggler's (10), or the next stage's that receives from it (12)."""
    root = tmp_path_factory.mktemp("untraced-pp")
    slow = ["--inject", f"straggler:rank={PIPELINE_STRAGGLER},ms=15"]
    whole = _simulated(root, "dp2tp2pp4", "dp=2,tp=2,pp=4", slow, "-m", "8", "--steps", "4")
    no_tp = _simulated(root, "dp2pp4", "dp=2,pp=4", ["--inject", "straggler:rank=5,ms=15"],
                       "-m", "8", "--steps", "4")  # fmt: skip
    interleaved = _simulated(root, "dp2tp2pp4-il", "dp=2,tp=2,pp=4", slow, "-m", "8", "--steps",
                             "4", "--schedule", "interleaved", "--virtual-stages", "2")  # fmt: skip
    megatron = _simulated(root, "dp2tp2pp4-il-megatron", "dp=2,tp=2,pp=4", slow, "-m", "8",
                          "--steps", "4", "--schedule", "interleaved", "--virtual-stages", "2",
                          "--trace-shape", "megatron")  # fmt: skip
    no_tp_megatron = _simulated(root, "dp2pp4-megatron", "dp=2,pp=4", ["--inject",
                                "straggler:rank=5,ms=15"], "-m", "8", "--steps", "4",
                                "--trace-shape", "megatron")  # fmt: skip
    two_stages = _simulated(root, "dp4tp2pp2", "dp=4,tp=2,pp=2", ["--inject",
                            "straggler:rank=6,ms=15"], "-m", "8", "--steps", "4",
                            "--trace-shape", "megatron")  # fmt: skip
    return {"whole": whole,
            "two-stages": two_stages,
            "two-stages-straggler-lost": _without(two_stages, 6, root / "dp4tp2pp2-no-6"),
            "no-tp-first-stage-lost": _without(no_tp, 4, root / "no-4"),
            "no-tp-megatron": no_tp_megatron,
            "no-tp-megatron-straggler-lost": _without(no_tp_megatron, 5, root / "megatron-no-5"),
            "no-tp-megatron-next-stage-lost": _without(no_tp_megatron, 6,
                                                       root / "megatron-no-6"),
            "megatron-interleaved": megatron,
            "megatron-next-stage-lost": _without(megatron, 12, root / "megatron-no-12"),
            "megatron-partners-lost": _without(megatron, (11, 12), root / "megatron-no-11-12"),
            "straggler-lost": _without(whole, PIPELINE_STRAGGLER, root / "no-10"),
            "next-stage-lost": _without(whole, 12, root / "no-12"),
            "no-tp": no_tp, "no-tp-next-stage-lost": _without(no_tp, 6, root / "no-6"),
            # a node lost: a whole TP group's files (nobody to stand in for them)
            "straggler-node-lost": _without(whole, (10, 11), root / "no-10-11"),
            "interleaved": interleaved,
            "interleaved-straggler-node-lost": _without(interleaved, (10, 11), root / "il-10-11"),
            "interleaved-last-node-lost": _without(interleaved, (14, 15), root / "il-no-14-15"),
            }  # fmt: skip


def test_a_lost_stage_rank_without_a_tp_partner_passes_the_straggler_on(
    pipeline: dict[str, Path],
) -> None:
    """dp2 x pp4, the straggler rank 5's next stage (rank 6) lost, no TP partner to read it
    from: its messages are relayed (rank 7 receives what rank 6 had from rank 5) and its
    data-parallel partner's all-reduce with it, held at its measured length, is removed
    beside the straggler to cost it. It read PIP003 on the last stage (the straggler's cost
    0: every step held by rank 2 waiting for the rank with no trace)."""
    whole = analyze_path(pipeline["no-tp"])["findings"][0]
    assert (whole["rule"], whole["ranks"]) == ("BAL001", [5])
    report = analyze_path(pipeline["no-tp-next-stage-lost"])
    main = report["findings"][0]
    assert (main["rule"], main["ranks"]) == ("BAL001", [5]), main["title"]
    assert main["cost_s"] == pytest.approx(whole["cost_s"], rel=0.2)
    # its cost is its compute's (Scenarios._split: each part costed as the whole is)
    (cause,) = [c for c in report["attribution"]["causes"] if c["kind"] == "straggler"]
    assert cause["evidence"]["compute_saving_s"] == pytest.approx(main["cost_s"], rel=0.05)


@pytest.mark.parametrize(("whole", "lost", "rule"), [
    ("no-tp", "no-tp-first-stage-lost", "BAL001"),
    ("no-tp-megatron", "no-tp-megatron-straggler-lost", "BAL006"),
    ("no-tp-megatron", "no-tp-megatron-next-stage-lost", "BAL001"),
])  # fmt: skip
def test_a_lost_rank_with_no_tp_partner_leaves_the_straggler_its_cost(
    pipeline: dict[str, Path], whole: str, lost: str, rule: str
) -> None:
    """dp2 x pp4, straggler rank 5, nobody to stand in for a lost rank:
    - its first stage's (rank 4) lost: rank 0's data-parallel all-reduces, alone of their
      group, waited 149 ms a step for rank 4 (which waited for the straggler), and that
      waiting read 1 ms: their bytes are the axis's largest (the first stage holds the
      embedding), and only a larger collective's transfer bounded theirs. A smaller one's,
      scaled by the ratio of bytes, bounds it too (late_members._transfer_bound): BAL003
      [5, 6, 7] at no cost came first before;
    - Megatron's shape (a receive and a send in one kernel, both with the lost rank): the
      send held the rank for the kernel's whole time and the receive then replayed its
      transfer again (the straggler's own trace lost: the replay 61% long, BAL006 at 388 ms
      against 149); its next stage's lost, 180 ms against 149. The two ops of the batch are
      now timed from their common start (local_time.py)."""
    first = analyze_path(pipeline[whole])["findings"][0]
    assert (first["rule"], first["ranks"]) == ("BAL001", [5])
    report = analyze_path(pipeline[lost])
    main = report["findings"][0]
    assert (main["rule"], main["ranks"]) == (rule, [5]), main["title"]
    assert main["cost_s"] == pytest.approx(first["cost_s"], rel=0.2)
    assert report["attribution"]["replay_error"] < 0.05


@pytest.mark.parametrize(("lost", "rule"), [("straggler-lost", "BAL006"),
                                            ("next-stage-lost", "BAL001")])  # fmt: skip
def test_a_pipeline_with_one_trace_lost_names_the_straggler_at_its_cost(
    pipeline: dict[str, Path], lost: str, rule: str
) -> None:
    """Rank 12's file lost: the straggler's messages to it and its data-parallel partner's
    all-reduce with it matched nothing, held at their measured length (the waiting the
    straggler caused, kept in every counterfactual), and a stage between a traced and an
    untraced neighbour read all its messages as the traced one's. It read 1.5% of the step
    for the straggler and named nobody; rank 10's lost, its peers' waiting for it read as
    0.4 ms. Now rank 12 is read from its TP partner 13 (lockstep), and rank 10 from 11."""
    whole = analyze_path(pipeline["whole"])["findings"][0]
    assert (whole["rule"], whole["ranks"]) == ("BAL001", [PIPELINE_STRAGGLER])
    main = analyze_path(pipeline[lost])["findings"][0]
    assert (main["rule"], main["ranks"]) == (rule, [PIPELINE_STRAGGLER]), main["title"]
    assert main["cost_s"] == pytest.approx(whole["cost_s"], rel=0.2)


def test_an_untraced_straggler_found_late_is_not_its_partner_too(
    pipeline: dict[str, Path],
) -> None:
    """dp4 x tp2 x pp2, the straggler's trace lost: its data-parallel peers' waits name it
    (BAL006), and its TP partner's excess, all waiting for it, is that same straggler: it
    read BAL001 on the partner first, at the same cost."""
    first = analyze_path(pipeline["two-stages"])["findings"][0]
    assert (first["rule"], first["ranks"]) == ("BAL001", [6])
    findings = analyze_path(pipeline["two-stages-straggler-lost"])["findings"]
    main = findings[0]
    assert (main["rule"], main["ranks"]) == ("BAL006", [6]), main["title"]
    assert main["cost_s"] == pytest.approx(first["cost_s"], rel=0.2)
    assert not [f for f in findings if f["rule"] in ("BAL001", "BAL005") and 7 in f["ranks"]]


@pytest.mark.parametrize("lost", ["megatron-next-stage-lost", "megatron-partners-lost"])
def test_a_batch_with_a_lost_peer_is_split_by_its_lockstep_stand_in(
    pipeline: dict[str, Path], lost: str
) -> None:
    """Megatron's shape, interleaved: the last stage's batch receives from rank 12 and sends
    to the first stage; with rank 12's file lost, the batch kept the kernel's interval for
    both ops, so its send to the first stage read 15 ms of transfer after the receiver had
    started, and the replay of the step was 55% long: BAL006 [12] came first (223 ms) and
    the straggler read 30 ms of its 433. Now each op ends from its peer's op, the lost
    rank's read from its TP partner's (peers.stand_in_links)."""
    first = analyze_path(pipeline["megatron-interleaved"])["findings"][0]
    assert (first["rule"], first["ranks"]) == ("BAL001", [PIPELINE_STRAGGLER])
    report = analyze_path(pipeline[lost])
    main = report["findings"][0]
    assert (main["rule"], main["ranks"]) == ("BAL001", [PIPELINE_STRAGGLER]), main["title"]
    assert main["cost_s"] == pytest.approx(first["cost_s"], rel=0.2)
    assert report["attribution"]["replay_error"] < 0.05


@pytest.mark.parametrize(("whole", "lost", "named"), [
    ("whole", "straggler-node-lost", ("BAL006", [10, 11])),
    ("interleaved", "interleaved-straggler-node-lost", ("BAL006", [10, 11])),
    ("interleaved", "interleaved-last-node-lost", ("BAL001", [PIPELINE_STRAGGLER])),
])  # fmt: skip
def test_a_lost_nodes_whole_tp_group_is_read_as_one(
    pipeline: dict[str, Path], whole: str, lost: str, named: tuple[str, list[int]]
) -> None:
    """A node's traces lost: a whole TP group, nobody to stand in for it. Its members step
    together, so they are late together: one set of untraced members, their being on time
    read at once. Each read apart, the other kept its partner waiting at every layer and
    neither saved anything: the straggler's node lost read PIP003 on the last stage (40 ms
    against 194 ms). In an interleaved schedule the last stage sends back to the first half of
    what it receives (its second chunk's input): its messages are not relayed by count (the
    n-th received is not the n-th passed on); relayed, the replay missed the step by 71% and
    PIP003 came first."""
    first = analyze_path(pipeline[whole])["findings"][0]
    assert (first["rule"], first["ranks"]) == ("BAL001", [PIPELINE_STRAGGLER])
    main = analyze_path(pipeline[lost])["findings"][0]
    assert (main["rule"], main["ranks"]) == named, main["title"]
    assert main["cost_s"] == pytest.approx(first["cost_s"], rel=0.2)


def test_a_traced_straggler_whose_tp_partner_was_lost_is_named(folders) -> None:
    """Rank 2's file lost: its data-parallel all-reduces, waiting in the other members for
    it (and it for rank 3 in their TP all-reduce), read as transfer held at its length; the
    straggler's cost went to 'DP all-reduce not overlapped' at 0.3 ms."""
    whole = analyze_path(folders["two-groups"])["findings"][0]
    main = analyze_path(folders["partner-part"])["findings"][0]
    assert (main["rule"], main["ranks"]) == ("BAL001", [STRAGGLER]), main["title"]
    assert main["cost_s"] == pytest.approx(whole["cost_s"], rel=0.2)


def test_the_untraced_straggler_is_named_with_the_cost_its_trace_gives(folders) -> None:
    """Its dp group's all-reduces take 30 ms longer than the other dp group's of the same
    bytes: waiting for rank 3, whose TP partner also waited for it (standing in for it)."""
    whole = analyze_path(folders["two-groups"])["findings"][0]
    assert (whole["rule"], whole["ranks"]) == ("BAL001", [STRAGGLER])
    main = analyze_path(folders["two-groups-part"])["findings"][0]
    assert (main["rule"], main["ranks"]) == ("BAL006", [STRAGGLER]), main["title"]
    assert main["cost_s"] == pytest.approx(whole["cost_s"], rel=0.2)
    assert f"rank {STRAGGLER}, which left no records" in main["title"]


def test_an_untraced_straggler_its_partner_stands_for_is_named_not_the_partner(folders) -> None:
    """One rank per TP group traced: rank 2 waits in its TP all-reduces for rank 3, which it
    stands for (the only traced member of its group). Its persistent excess is that waiting,
    not its host's time: before, `host time: rank 2 spends 36% of the step on the host` came
    first, at 23.2 ms against the 29.7 ms rank 3 costs."""
    whole = analyze_path(folders["two-groups"])["findings"][0]
    findings = analyze_path(folders["one-per-tp"])["findings"]
    main = findings[0]
    assert (main["rule"], main["ranks"]) == ("BAL006", [STRAGGLER]), main["title"]
    assert main["cost_s"] == pytest.approx(whole["cost_s"], rel=0.2)
    assert main["evidence"]["wait_per_step_s"] == pytest.approx(0.030, rel=0.2)
    assert "rank 2 wait" in main["title"] and f"rank {STRAGGLER}, which left no" in main["title"]
    assert not [f for f in findings if f["rule"] in ("BAL001", "BAL005") and 2 in f["ranks"]]


def test_one_group_cannot_tell_transfer_from_waiting_and_says_so(folders) -> None:
    """Every all-reduce of the only dp group waits alike: no faster one bounds the transfer.
    The communication finding's cost is then a range from 0 (all waiting for rank 3)."""
    report = analyze_path(folders["one-group-part"])
    assert not [f for f in report["findings"] if f["rule"] == "BAL006"]
    (comm,) = [f for f in report["findings"] if f["rule"] == "COM001"]
    low, high = comm["cost_range_s"]
    assert low < 0.1 * high and high == pytest.approx(comm["cost_s"])
    assert f"waiting for rank {STRAGGLER}" in comm["evidence"]["cost_range_reason"]


def test_a_healthy_job_missing_a_trace_names_no_one(folders) -> None:
    report = analyze_path(folders["healthy-part"])
    assert not [f for f in report["findings"] if f["rule"] == "BAL006"], report["findings"]
    assert all((f.get("cost_share") or 0) < 0.05 for f in report["findings"]), report["findings"]


def test_a_pipeline_stage_whose_traces_are_lost_is_named_at_its_cost(folders) -> None:
    """The stage before it waits in every message to it (its send and receive kernels spin
    until the untraced peer's is there), beyond the fastest message of as many bytes between
    traced stages. Before, PIP002 came first and the replay missed the step by 62% (a batched
    send and receive to the untraced peer, each with the kernel's time, played twice)."""
    whole = analyze_path(folders["stage"])["findings"][0]
    assert (whole["rule"], whole["ranks"]) == ("PIP003", list(LAST_STAGE))
    report = analyze_path(folders["stage-part"])
    main = report["findings"][0]
    assert (main["rule"], main["ranks"]) == ("BAL006", list(LAST_STAGE)), main["title"]
    assert main["cost_s"] == pytest.approx(whole["cost_s"], rel=0.2)
    assert report["attribution"]["replay_error"] < 0.05


def test_a_slow_stage_beside_a_lost_rank_of_another_stage_is_named(folders) -> None:
    """dp2 x pp4, stage 3 slow, rank 2 (stage 2) lost: stage 3's work reached the step only
    through the lost rank's messages and its data-parallel partner's all-reduce with it,
    held at their measured length: COM001 came first and stage 3 cost 0. Read beside those
    held waits removed, stage 3 is named first, at its cost where sends and receives are
    not batched. In Megatron's shape it read about half its cost while a batch with an op
    to the lost rank kept the kernel's whole interval for all its ops (96.7 ms against
    195.2); with the ops whose peers are known ending a typical transfer after they met,
    156.9 ms (no TP partner stands for the lost rank here)."""
    whole = analyze_path(folders["stage"])["findings"][0]
    costs = {}
    for name in ("stage-before-lost", "stage-dm-before-lost"):
        main = analyze_path(folders[name])["findings"][0]
        assert (main["rule"], main["ranks"]) == ("PIP003", list(LAST_STAGE)), main["title"]
        costs[name] = main["cost_s"]
    assert costs["stage-dm-before-lost"] == pytest.approx(whole["cost_s"], rel=0.2)
    assert costs["stage-before-lost"] > 0.75 * whole["cost_s"]
