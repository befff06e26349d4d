"""The work of members nobody traced (diag/whatif/absent_members.py), read from one traced rank
per tensor-parallel group: a simulated jitter job written as a profiler trace of every rank,
and the same files with one rank per TP group kept (records missing, nothing else changed).

Where a traced rank waited for its untraced member, that member arrived last and its time is
measured: the group's mean own time is the true one (the full traces'), which the traced
rank's own time alone is not (the stage's mean then came from half its ranks, and the jitter
job's random-imbalance cost read 25% low at 16 ranks). Where the traced rank arrived last, the
member is only known to have taken less."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diag.api import load_any
from diag.metrics.common import analysed_steps
from diag.read.load import RunData
from diag.read.roles import rank_roles
from diag.whatif import timeline as tl
from diag.whatif.absent_members import (
    ARRIVED_LAST_SLACK_NS,
    ARRIVED_LAST_SLACK_SHARE,
    mean_below,
    members_own_time,
)
from diag.whatif.places import stage_places

JOB = ["--ranks", "8", "--layout", "dp=2,tp=2,pp=2", "--microbatches", "4", "--layers", "4",
       "--steps", "5", "--inject", "jitter:ms=40", "--format", "kineto"]  # fmt: skip
"""Every rank's first forward of a step takes a random 0-40 ms more: in each TP group the later
member holds the other at their first TP collective."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunData, RunData, dict[int, int]]:
    """The job read from every rank's trace, from one trace per TP group, and each kept
    rank's untraced member."""
    work = tmp_path_factory.mktemp("absent")
    full = work / "full"
    command = [sys.executable, "-m", "diag", "simulate", *JOB, "--out", str(full)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    every = load_any(full)
    groups = every.manifest.groups["tp"]  # the test's own layout: TP groups of two
    member = {min(group): max(group) for group in groups}
    partial = work / "one-per-tp"
    partial.mkdir()
    for trace in full.glob("*.pt.trace.json"):
        if _rank_of(trace) in member:
            shutil.copy(trace, partial / trace.name)
    return every, load_any(partial), member


def _rank_of(trace: Path) -> int:
    """The rank a trace file holds (its `distributedInfo`), read without the reader."""
    return int(json.loads(trace.read_text())["distributedInfo"]["rank"])


def _timeline(run: RunData) -> tl.Timeline:
    windows, _ = analysed_steps(run.steps, run.starts_at_warmup)
    return tl.build(run, windows)


def _members(run: RunData, timeline: tl.Timeline) -> pd.DataFrame:
    """Per event: rank, step, j, the rank's own time, whether it waited for a member nobody
    traced beyond the transfer's variation, and the members' mean own time read."""
    ev = timeline.events
    seg = ev["seg_ns"].to_numpy(dtype=np.float64)
    absent = ev["absent_ns"].to_numpy(dtype=np.float64)
    transfer = (ev["e_ns"] - ev["a_ns"]).to_numpy(dtype=np.float64)
    stand_in = ev["stand_in"].to_numpy(dtype=np.float64)
    places = stage_places(ev, rank_roles(run, timeline.ranks))
    slack = np.maximum(ARRIVED_LAST_SLACK_NS, ARRIVED_LAST_SLACK_SHARE * transfer)
    return pd.DataFrame({
        "rank": ev["rank"], "step": ev["step"], "j": ev["j"], "own": seg - absent,
        "waited": (stand_in > 0) & (absent > slack),
        "members": members_own_time(seg, absent, transfer, stand_in, places),
    })  # fmt: skip


def test_a_member_that_arrived_last_is_read_at_its_measured_time(
    folders: tuple[RunData, RunData, dict[int, int]],
) -> None:
    every, partial, member_of = folders
    truth = _timeline(every).events.set_index(["rank", "step", "j"])["seg_ns"]
    read = _members(partial, _timeline(partial))
    assert set(read["rank"]) == set(member_of)
    waited = read[read["waited"]]
    assert len(waited) >= 4  # the draws make some untraced members late
    untraced = waited["rank"].map(member_of)
    keys = pd.MultiIndex.from_arrays([untraced, waited["step"], waited["j"]])
    member = truth.reindex(keys).to_numpy()  # the untraced member at the same place
    mine = truth.reindex(pd.MultiIndex.from_frame(waited[["rank", "step", "j"]])).to_numpy()
    want = (mine + member) / 2
    # their times as all traces give them; the traced rank's own time is far from it
    assert waited["members"].to_numpy() == pytest.approx(want, rel=0.01, abs=50_000)
    assert not np.allclose(waited["own"].to_numpy(), want, rtol=0.1)


def test_where_the_traced_rank_arrived_last_its_members_took_less(
    folders: tuple[RunData, RunData, dict[int, int]],
) -> None:
    """Bounded by its time, a member that did not arrive last is read at the mean own time
    of the traced ranks at the same place of the stage's step below the last's."""
    _, partial, _ = folders
    timeline = _timeline(partial)
    read = _members(partial, timeline)
    standing = timeline.events["stand_in"].to_numpy() > 0
    last = read[standing & ~read["waited"].to_numpy()]
    assert len(last) > 0
    seg = timeline.events.loc[last.index, "seg_ns"].to_numpy(dtype=np.float64)
    assert (last["members"].to_numpy() <= seg + 1).all()
    # where no traced rank stands for anyone (a send, a step's start): its own time
    alone = read[~standing]
    assert alone["members"].to_numpy() == pytest.approx(alone["own"].to_numpy())


def test_a_member_not_last_is_read_from_the_traced_times_below_the_last() -> None:
    """One place of a stage, three steps' traced ranks (own times 10, 20, 40 ms; one
    untraced partner each). The first two waited for their partners (measured: 30 ms); the
    third arrived last, so its partner took less: read at the mean of the traced times below
    40 ms (15 ms). A rank that arrived last with no traced time below its own reads its
    partner at its own time."""
    ms = 1_000_000
    own = np.array([10, 20, 40], dtype=np.float64) * ms
    absent = np.array([20, 10, 0], dtype=np.float64) * ms  # the first two waited for partners
    seg = own + absent
    transfer = np.full(3, 0.1 * ms)
    read = members_own_time(seg, absent, transfer, np.ones(3), np.zeros(3, dtype=np.int64))
    assert read == pytest.approx(np.array([20, 25, 27.5]) * ms)
    alone = members_own_time(own[:1], np.zeros(1), transfer[:1], np.ones(1), np.zeros(1, int))
    assert alone == pytest.approx([10 * ms])


def test_themean_below_a_bound_equals_a_plain_count() -> None:
    """absent_members.mean_below (one sort) against the definition, on random places,
    values with gaps (NaN) and ties with the bounds."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        places = rng.integers(0, 4, n)
        values = rng.integers(0, 10, n).astype(np.float64)
        values[rng.random(n) < 0.3] = np.nan
        bound = rng.integers(0, 12, n).astype(np.float64)
        want = []
        for i in range(n):
            below = [v for v, p in zip(values, places, strict=True)
                     if p == places[i] and not np.isnan(v) and v < bound[i]]  # fmt: skip
            want.append(np.mean(below) if below else np.nan)
        assert mean_below(values, places, bound) == pytest.approx(np.array(want), nan_ok=True)
