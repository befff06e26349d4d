"""A trace folder whose hosts' clocks differ reads as the same job on one clock: the offsets
are read from the collectives' ends (members of an all-reduce finish together) and removed,
with a note (diag/read/kineto/clocks.py). Before, a second host's clock 20 ms ahead made the
straggler of this job cost 9.6 ms instead of 29.4 and no longer come first. Hosts that share
no all-reduce (a pipeline's stage-hosts) are aligned through their messages' ends
(diag/read/kineto/message_clocks.py): before, the last stage-host 20 ms ahead made a
straggler cost 54.7 ms instead of 189.1, and a slow stage read COM001 first."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from diag.api import analyze_path
from diag.read.kineto.message_clocks import message_pairs

SHIFT_MS = 20
SECOND_HOST = (2, 3)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dp=4 job on two hosts of two GPUs, rank 1 a straggler; and the same traces with the
    second host's clock SHIFT_MS ahead (every time its profiler wrote moved by it)."""
    root = tmp_path_factory.mktemp("clocks")
    base = root / "one-clock"
    args = ["--layout", "dp=4", "--gpus-per-node", "2", "--steps", "5", "--format", "kineto",
            "--inject", "straggler:rank=1,ms=30", "--out", str(base)]  # fmt: skip
    subprocess.run([sys.executable, "-m", "diag", "simulate", *args], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    shifted = root / "two-clocks"
    shutil.copytree(base, shifted)
    for path in shifted.glob("*.json"):
        trace = json.loads(path.read_text())
        if trace.get("distributedInfo", {}).get("rank") in SECOND_HOST:
            for event in trace["traceEvents"]:
                if "ts" in event:
                    event["ts"] += SHIFT_MS * 1000
            path.write_text(json.dumps(trace))
    return {"one": base, "two": shifted}


def _main(report: dict) -> dict:
    return report["findings"][0]


def test_a_second_hosts_clock_is_aligned_and_the_straggler_keeps_its_cost(folders) -> None:
    one, two = analyze_path(folders["one"]), analyze_path(folders["two"])
    assert not any("clocks aligned" in note for note in one["skipped"])
    (note,) = [note for note in two["skipped"] if "clocks aligned" in note]
    assert f"rank 2 -{SHIFT_MS} ms, rank 3 -{SHIFT_MS} ms" in note, note
    assert "rank 0" not in note and "rank 1 " not in note  # the clock most ranks keep
    first, aligned = _main(one), _main(two)
    assert (aligned["rule"], aligned["ranks"]) == (first["rule"], first["ranks"]) == ("BAL001", [1])
    assert aligned["cost_s"] == pytest.approx(first["cost_s"], rel=0.05)


def test_offsets_below_the_ends_noise_are_left_alone(folders, tmp_path: Path) -> None:
    """A few microseconds apart (one host, or clocks synchronised well) is not a clock."""
    near = tmp_path / "near"
    shutil.copytree(folders["one"], near)
    for path in near.glob("*.json"):
        trace = json.loads(path.read_text())
        if trace.get("distributedInfo", {}).get("rank") in SECOND_HOST:
            for event in trace["traceEvents"]:
                if "ts" in event:
                    event["ts"] += 10  # 10 us
            path.write_text(json.dumps(trace))
    report = analyze_path(near)
    assert not any("clocks aligned" in note for note in report["skipped"])


# A pipeline whose stages are whole hosts: dp=4 x pp=4, stage s the ranks s, s+4, s+8, s+12
# (the simulator's grid puts pp inside dp, so its hosts are pipelines: here the files of one
# stage are moved together, as one host's profiler would write them). Each stage's all-reduces
# stay inside it; only the sends and receives between neighbouring stages cross hosts, as
# Megatron issues them (batch_isend_irecv: batched SendRecv kernels naming their peers).
STAGES = 4
STAGE_ARGS = {
    "straggler": ["--inject", "straggler:rank=5,ms=30"],
    "slow-stage": ["--inject", "stage-slow:stage=2,ms=20"],
}


def _shifted_copy(base: Path, to: Path, ranks: set[int], shift_us: int) -> Path:
    """`base` copied to `to` with every time the profilers of `ranks` wrote moved `shift_us`."""
    shutil.copytree(base, to, ignore=shutil.ignore_patterns(".diag-cache"))
    for path in to.glob("*.json"):
        trace = json.loads(path.read_text())
        if trace.get("distributedInfo", {}).get("rank") in ranks:
            for event in trace["traceEvents"]:
                if "ts" in event:
                    event["ts"] += shift_us
            path.write_text(json.dumps(trace))
    return to


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stage-hosts")
    out = {}
    for name, inject in STAGE_ARGS.items():
        out[name] = root / name
        args = ["--layout", f"dp=4,pp={STAGES}", "--gpus-per-node", "4", "--steps", "5",
                "-m", "8", "--format", "kineto", "--trace-shape", "megatron", *inject,
                "--out", str(out[name])]  # fmt: skip
        subprocess.run([sys.executable, "-m", "diag", "simulate", *args], check=True,
                       capture_output=True, timeout=300)  # fmt: skip
    return out


def _stage(s: int) -> set[int]:
    return {s + STAGES * i for i in range(4)}


@pytest.mark.parametrize(
    ("job", "stage", "shift_ms"),
    [("straggler", 3, 20), ("straggler", 3, 3), ("slow-stage", 1, 20), ("slow-stage", 0, 3)],
)
def test_a_stage_hosts_clock_is_aligned_through_its_messages(
    pipelines, tmp_path: Path, job: str, stage: int, shift_ms: int
) -> None:
    """No all-reduce crosses the stage-hosts: the shifted stage is read through the sends and
    receives with its neighbour (their kernels end together), chained from the reference."""
    one = analyze_path(pipelines[job])
    two = analyze_path(_shifted_copy(pipelines[job], tmp_path / "shifted", _stage(stage),
                                     shift_ms * 1000))  # fmt: skip
    assert not any("clock" in note for note in one["skipped"])
    (note,) = [note for note in two["skipped"] if "clocks aligned" in note]
    moved = ", ".join(f"rank {r} -{shift_ms} ms" for r in sorted(_stage(stage)))
    assert moved in note and "messages' ends" in note, note
    assert {int(r) for r in re.findall(r"rank (\d+) [+-]", note)} == _stage(stage), note
    first, aligned = _main(one), _main(two)
    assert (aligned["rule"], aligned["ranks"]) == (first["rule"], first["ranks"])
    assert aligned["cost_s"] == pytest.approx(first["cost_s"], rel=0.05)


def test_a_stage_host_microseconds_apart_is_left_alone(pipelines, tmp_path: Path) -> None:
    near = _shifted_copy(pipelines["straggler"], tmp_path / "near", _stage(3), 10)
    assert not any("clock" in note for note in analyze_path(near)["skipped"])


def test_batches_sent_to_one_neighbour_and_received_from_the_other_are_not_paired(
    tmp_path: Path,
) -> None:
    """An interleaved schedule's batches send to the next stage and receive from the previous
    one: each kernel ends with whichever transfer is last, not with its peer's. Such messages
    link no clock, and a note names the ranks whose clock is left unchecked."""
    base = tmp_path / "interleaved"
    args = ["--layout", "dp=2,pp=4", "--gpus-per-node", "4", "--steps", "2", "-m", "8",
            "--schedule", "interleaved", "--virtual-stages", "2", "--format", "kineto",
            "--trace-shape", "megatron", "--out", str(base)]  # fmt: skip
    subprocess.run([sys.executable, "-m", "diag", "simulate", *args], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    last = {3, 7}  # the last stage's ranks
    report = analyze_path(_shifted_copy(base, tmp_path / "shifted", last, 20_000))
    (note,) = [note for note in report["skipped"] if "not checked" in note]
    named = note.split("host clocks of ")[1].split(" are not checked")[0]
    assert last <= {int(r) for r in re.findall(r"\d+", named)}, note
    assert not any("clocks aligned" in note for note in report["skipped"])


def test_a_send_pairs_with_its_receive_by_peer_and_order() -> None:
    """The k-th send of a step from a to b is the k-th receive of that step on b from a; a
    link whose step holds unequal counts (a trace cut inside it) is not paired."""
    rows = []
    for k in range(3):  # step 0: three messages 0 -> 1, the receiver's clock 5 ms ahead
        rows.append(
            {"rank": 0, "step": 0, "op": "send", "peer": 1, "t0": 100 * k, "t1": 100 * k + 50}
        )
        rows.append({"rank": 1, "step": 0, "op": "recv", "peer": 0, "t0": 100 * k + 5_000_000 - 30,
                     "t1": 100 * k + 50 + 5_000_000})  # fmt: skip
    rows.append({"rank": 0, "step": 1, "op": "send", "peer": 1, "t0": 1_000, "t1": 1_050})
    comms = pd.DataFrame(rows).assign(group="g")
    comms["peer"] = comms["peer"].astype("Int64")
    pairs = message_pairs(comms)
    assert len(pairs) == 3 and set(pairs.sender) == {0} and set(pairs.receiver) == {1}
    assert list(pairs.recv_end - pairs.send_end) == [5_000_000] * 3
    assert pairs.unused_ranks == {0}  # step 1's send: no receive in the trace
