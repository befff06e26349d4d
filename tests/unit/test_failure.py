"""A job that did not finish (issue 40): the run's status from its records, the failure finding
first and its renderings, `diag check` failing on it, Flight Recorder dumps read safely (a
hostile pickle never runs), and `diag watch` naming a silent rank while a run grows.

The runs are written as the collectors write them by the contract (rule_cases/failure.py);
tests/distributed/test_flight_recorder.py runs real gloo jobs and their real dumps."""

from __future__ import annotations

import io
import json
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rule_cases.failure import STEP_MS, failure_run, run_ns

from diag.api import analyze_path
from diag.cli.main import main
from diag.cli.watch import watch
from diag.contract.limits import MAX_FR_DEPTH, MAX_FR_OBJECTS
from diag.errors import InputError
from diag.outputs.report import render_html, render_markdown, render_text
from diag.read.flight_recorder import read_dump
from diag.read.safe_pickle import RefusedPickle, load_plain

KINDS = ("hang", "crash", "desync", "lost", "undecidable", "completed", "late")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The report of each hand-written run; the ended ones with their files an hour old,
    `late` and `running` (the undecidable one's records) with files just written."""
    from tests.conftest import RunWriter

    writer = RunWriter(tmp_path_factory.mktemp("failure"))
    found = {}
    for kind in (*KINDS, "running"):
        if kind == "running":  # the undecidable run's records, still arriving
            path = failure_run(writer, "undecidable", name=kind, ended=False)
        else:
            path = failure_run(writer, kind, name=kind)
        found[kind] = analyze_path(path)
    return found


@pytest.mark.parametrize(
    ("kind", "status", "rule", "rank"),
    [("hang", "hung", "FLR001", 2), ("crash", "failed", "FLR002", 2),
     ("desync", "hung", "FLR003", 2), ("lost", "failed", "FLR004", 2),
     ("undecidable", "undecidable", "FLR005", None)],
)  # fmt: skip
def test_the_failure_is_the_status_and_the_first_finding(
    reports: dict[str, dict[str, Any]], kind: str, status: str, rule: str, rank: int | None
) -> None:
    report = reports[kind]
    assert report["summary"]["status"] == status, report["summary"]["status_reason"]
    first = report["findings"][0]
    assert first["rule"] == rule, [f["rule"] for f in report["findings"]]
    if rank is not None:
        assert first["ranks"] == [rank]
        assert report["summary"]["failed_step"] == 6
    performance = [f for f in report["findings"] if not f["rule"].startswith("FLR")]
    assert performance, "the steps before the failure are still analysed"
    assert report["summary"]["steps_analysed"] == 5  # steps 1-5 (0 is the warm-up)
    assert any("step 6 did not finish" in note for note in report["skipped"]) == (rank is not None)


def test_the_hang_names_the_collective_who_waited_and_where_the_missing_rank_stopped(
    reports: dict[str, dict[str, Any]],
) -> None:
    report = reports["hang"]
    first = report["findings"][0]
    assert "all_reduce #7 of dp" in first["title"] and "step 6" in first["title"]
    assert "never joined" in first["title"] and "next_batch (loader.py:12)" in first["title"]
    stuck = first["evidence"]["collective"]
    assert (stuck["waiting"], stuck["missing"], stuck["bytes"]) == ([0, 1, 3], [2], 4096)
    assert all(s == pytest.approx(20.0) for s in stuck["waited_s"].values())
    where = {row["rank"]: row for row in report["where_stopped"]}
    assert where[2]["state"] == "stalled" and where[2]["span"] == "fwd (open, step 6)"
    assert where[0]["state"] == "waiting" and where[0]["collective"] == "all_reduce #7 of dp"


def test_a_crash_names_the_exception_and_the_ranks_left_waiting(
    reports: dict[str, dict[str, Any]],
) -> None:
    first = reports["crash"]["findings"][0]
    assert "RuntimeError" in first["title"] and "illegal memory access" in first["title"]
    assert first["evidence"]["left_waiting"] == [0, 1, 3]
    # the hang it causes ranks below it (the crash explains it)
    rules = [f["rule"] for f in reports["crash"]["findings"]]
    assert rules.index("FLR002") < rules.index("FLR001")


@pytest.mark.parametrize(
    ("kind", "rule", "status"),
    [
        ("timeout-hang", "FLR001", "hung"),
        ("timeout-desync", "FLR003", "failed"),
        ("timeout-crash", "FLR002", "failed"),
        ("timeout-bare", "FLR001", "failed"),
    ],
)
def test_a_group_timeout_is_the_consequence_not_the_crash(
    tmp_path: Path, kind: str, rule: str, status: str
) -> None:
    """Ranks whose collective raised the group's timeout (read while their files are fresh, the
    timeout shorter than the window) waited for rank 2, which never joined, joined with
    another op or raised in it first: rank 2 is named, the others timed out."""
    from tests.conftest import RunWriter

    report = analyze_path(failure_run(RunWriter(tmp_path), kind, name=kind))
    summary = report["summary"]
    assert summary["status"] == status, summary["status_reason"]
    rules = [f["rule"] for f in report["findings"]]
    assert rules[0] == rule and rules.count("FLR002") == (rule == "FLR002"), rules
    assert report["findings"][0]["ranks"] == [2]
    states = {row["rank"]: row["state"] for row in report["where_stopped"]}
    assert [states[r] for r in (0, 1, 3)] == ["timed out"] * 3, states


def test_a_rank_that_aborted_before_the_launcher_ended_the_job_is_named(tmp_path: Path) -> None:
    """Rank 2's records stop in its forward pass (it aborted); 2 s later the launcher ends the
    others (SIGTERM records), read at once: rank 2 is lost, not 'rank 0 received SIGTERM'."""
    from tests.conftest import RunWriter

    report = analyze_path(failure_run(RunWriter(tmp_path), "aborted", name="aborted"))
    first = report["findings"][0]
    assert (first["rule"], first["ranks"]) == ("FLR004", [2]), first["title"]
    assert report["summary"]["status"] == "failed", report["summary"]["status_reason"]


@pytest.mark.parametrize("kind", ["aborted-early", "aborted-early-cut", "aborted-early-dumped"])
def test_a_rank_that_died_before_any_heartbeat_is_lost_not_hung(tmp_path: Path, kind: str) -> None:
    """The same abort in a job's first second, read at once: no rank's heartbeat reached the
    disk yet (a loaded host delays it), rank 2's records stop after step 5, the others raised
    in all-reduce #7 300 ms in and recorded the launcher's SIGTERM. Their signal records show
    the collector writes signs of life: rank 2 is lost, as it is once a heartbeat is there
    (the verdict flipped between FLR001 and FLR004 on that timing), and the finding names
    the collective it never joined and its step. `-cut`: rank 0's SIGTERM record never
    reached the disk; it waited in the all-reduce rank 2 never joined: a victim, not lost.
    `-dumped`: rank 0's records stop where rank 2's do, but it lived to dump its Flight
    Recorder (a killed process leaves none): rank 2 alone is lost."""
    from tests.conftest import RunWriter

    report = analyze_path(failure_run(RunWriter(tmp_path), kind, name="early"))
    first = report["findings"][0]
    assert (first["rule"], first["ranks"]) == ("FLR004", [2]), first["title"]
    lost = [f["ranks"] for f in report["findings"] if f["rule"] == "FLR004"]
    assert lost == [[2]], lost
    never = first["evidence"]["never_joined"]
    assert (never["op"], never["seq"], never["step"]) == ("all_reduce", 7, 6), never
    # (rank 0's own records of step 6 are lost in `-dumped`: they say it never joined either)
    assert never["missing"] == ([0, 2] if kind.endswith("dumped") else [2]), never
    assert "never joined all_reduce #7 of dp" in first["title"]
    assert report["summary"]["status"] == "failed", report["summary"]["status_reason"]


def test_a_rank_behind_but_moving_is_not_blamed_for_the_hang(tmp_path: Path) -> None:
    """Rank 2 hangs in its loader; rank 0, a step behind, still finishes its backward pass
    after the others began to wait when the job ends: rank 2 never joined, not ranks 0 and 2."""
    from tests.conftest import RunWriter

    report = analyze_path(failure_run(RunWriter(tmp_path), "hang-behind", name="behind"))
    first = report["findings"][0]
    assert (first["rule"], first["ranks"]) == ("FLR001", [2]), first["title"]
    assert "rank 2 never joined" in report["summary"]["status_reason"]


@pytest.mark.parametrize("kind", ["completed", "late", "running"])
def test_finished_and_running_runs_raise_no_failure_finding(
    reports: dict[str, dict[str, Any]], kind: str
) -> None:
    report = reports[kind]
    expected = "completed" if kind == "completed" else "running"
    assert report["summary"]["status"] == expected, report["summary"]["status_reason"]
    assert not [f for f in report["findings"] if f["rule"].startswith("FLR")]
    assert "where_stopped" not in report and "failure" not in report


def test_every_rendering_opens_with_the_failure(reports: dict[str, dict[str, Any]]) -> None:
    report = reports["hang"]
    text = render_text(report)
    assert text.startswith("HUNG: rank 2 never joined all_reduce #7 of dp (step 6)")
    assert text.index("where each rank stopped") < text.index("where the step goes")
    assert "where each rank stopped" in render_markdown(report)
    html = render_html(report)
    assert "where each rank stopped" in html and "next_batch (loader.py:12)" in html
    assert render_text(reports["completed"]).startswith("test-run")  # no status line


def test_check_fails_on_a_run_that_did_not_complete(tmp_path: Path) -> None:
    from tests.conftest import RunWriter

    writer = RunWriter(tmp_path)
    for kind in ("hang", "crash", "lost"):
        path = failure_run(writer, kind, name=kind)
        for limits in (["--max-comm-share", "1"], []):  # whatever its limits, none included
            result = CliRunner().invoke(main, ["check", str(path), *limits])
            assert result.exit_code == 1, result.output
            assert result.output.splitlines()[0].startswith("run "), result.output
    done = failure_run(writer, "completed", name="completed")
    result = CliRunner().invoke(main, ["check", str(done), "--max-comm-share", "1"])
    assert result.exit_code == 0, result.output


# --- Flight Recorder dumps read safely ---------------------------------------------------------


class _RunsCode:
    """Loading its pickle would call os.system (through __reduce__)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = pickle.dumps({"entries": [_RunsCode(marker)], "version": "2.10"})
    pickle.loads(pickle.dumps(0))  # the real unpickler works here: the refusal is ours
    with pytest.raises(RefusedPickle, match="names a global"):
        load_plain(hostile, 2**20, MAX_FR_OBJECTS, MAX_FR_DEPTH)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "rank-00000.pkl").write_bytes(hostile)
    for protocol in (0, 2, 5):  # GLOBAL, STACK_GLOBAL and older opcodes alike
        (dumps / "rank-00001.pkl").write_bytes(pickle.dumps([_RunsCode(marker)], protocol))
        with pytest.raises(ValueError, match="refused"):
            read_dump(dumps / "rank-00001.pkl")
    with pytest.raises(InputError, match="dump JSON instead"):
        analyze_path(dumps)
    assert not marker.exists(), "the pickle ran code"


def test_hostile_pickles_are_bounded(tmp_path: Path) -> None:
    # one list referenced twice at every level: 2**40 values to walk from a few hundred bytes
    shared: list[Any] = []
    for _ in range(40):
        shared = [shared, shared]
    with pytest.raises(RefusedPickle, match=r"values|deeper"):
        load_plain(pickle.dumps(shared), 2**20, MAX_FR_OBJECTS, MAX_FR_DEPTH)
    with pytest.raises(RefusedPickle, match="above the limit"):
        load_plain(b"\x80\x04" + b"N" * 100, 10, MAX_FR_OBJECTS, MAX_FR_DEPTH)
    with pytest.raises(RefusedPickle, match="not a readable pickle"):
        load_plain(b"\x80\x04\x95garbage", 2**20, MAX_FR_OBJECTS, MAX_FR_DEPTH)
    persistent = io.BytesIO()
    pickler = pickle.Pickler(persistent, 2)
    pickler.persistent_id = lambda obj: "x" if obj == "p" else None  # type: ignore[method-assign]
    pickler.dump(["p"])
    with pytest.raises(RefusedPickle, match="persistent"):
        load_plain(persistent.getvalue(), 2**20, MAX_FR_OBJECTS, MAX_FR_DEPTH)


def test_a_plain_pickled_dump_reads_like_its_json(tmp_path: Path) -> None:
    dump = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
            "entries": [{"process_group": ("0", "default_pg"), "collective_seq_id": 1,
                         "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "gloo:all_reduce",
                         "input_sizes": [[8]], "input_dtypes": ["Float"], "state": "scheduled",
                         "retired": False, "time_created_ns": 5,
                         "frames": [{"name": "step", "filename": "train.py",
                                     "line": 3}]}]}  # fmt: skip
    (tmp_path / "rank-00000.pkl").write_bytes(pickle.dumps(dump, 4))
    assert read_dump(tmp_path / "rank-00000.pkl")["entries"][0]["collective_seq_id"] == 1


def test_a_dump_too_large_or_too_deep_is_refused_with_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "rank-00000.json"
    deep.write_text('{"entries": ' + "[" * 40 + "]" * 40 + "}")
    with pytest.raises(ValueError, match="deeper"):
        read_dump(deep)
    not_dump = tmp_path / "rank-00001.json"
    not_dump.write_text(json.dumps({"version": "2.10"}))
    with pytest.raises(ValueError, match="no `entries`"):
        read_dump(not_dump)


# --- diag watch on a growing run -----------------------------------------------------------------


def test_watch_names_the_silent_rank_in_time_and_fails_when_the_job_dies(tmp_path: Path) -> None:
    """4 ranks write 100 ms steps as a job would; from step 6 rank 2 writes nothing while the
    others sit in all-reduce #7 heartbeating, then every rank stops. watch names rank 2 within
    3 median steps + 5 s of its last record, and returns `failed` once the job is silent."""
    from tests.conftest import RunWriter

    run = tmp_path / "run"
    full = failure_run(RunWriter(tmp_path / "src"), "lost")
    run.mkdir()
    (run / "manifest.json").write_text((full / "manifest.json").read_text())
    lines = {r: (full / f"rank-{r:05d}.jsonl").read_text().splitlines() for r in range(4)}
    handles = {r: (run / f"rank-{r:05d}.jsonl").open("a") for r in range(4)}
    silenced = {}
    stop = threading.Event()
    started = time.monotonic()  # the records' clock starts with the job

    def job() -> None:
        for step in range(8):
            for rank, rows in lines.items():
                mine = [row for row in rows if json.loads(row)["step"] == step]
                if step == 6 and rank != 2:
                    mine = [r for r in mine if json.loads(r).get("name") != "heartbeat"]
                handles[rank].write("".join(f"{row}\n" for row in mine))
                handles[rank].flush()
            if step == 5:
                silenced["at"] = time.monotonic()
            time.sleep(STEP_MS / 1000)
        for _ in range(20):  # the survivors heartbeat while they wait in all-reduce #7
            if stop.wait(0.2):
                return
            for rank in (0, 1, 3):
                beat = {
                    "kind": "event",
                    "step": 6,
                    "name": "heartbeat",
                    "interval_s": 0.2,
                    "t_ns": run_ns((time.monotonic() - started) * 1000),
                }  # the run's clock
                handles[rank].write(json.dumps(beat) + "\n")
                handles[rank].flush()

    out = _Timed()
    writer = threading.Thread(target=job)
    writer.start()
    try:
        status = watch(run, interval_s=0.2, wait_s=5, out=out)
    finally:
        stop.set()
        writer.join()
    silent = [(t, line) for t, line in out.lines if line.startswith("silent rank 2")]
    assert silent, out.getvalue()
    named_after_s = silent[0][0] - silenced["at"]
    assert named_after_s < 3 * STEP_MS / 1000 + 5.0, (named_after_s, out.getvalue())
    assert "ranks 0, 1, 3 wait in #7 of dp" in silent[0][1]
    assert not [line for _, line in out.lines if line.startswith("silent rank 0")]
    assert status == "failed" and "the job died" in out.getvalue()
    verdict = [line for _, line in out.lines if line.startswith("diag watch: HUNG")]
    assert verdict and "rank 2 never joined all_reduce #7 of dp" in verdict[0], out.getvalue()


class _Timed(io.StringIO):
    """The watch's output, each line with the time it was written."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        if text.strip():
            self.lines.append((time.monotonic(), text.strip()))
        return super().write(text)


def test_the_html_report_and_the_dashboard_open_with_the_stuck_collective(tmp_path: Path) -> None:
    from dashboard.data import LoadedRun
    from dashboard.html_report import plotly_js_gzip, report_charts
    from dashboard.pages import overview
    from diag.api import diagnose, load_any
    from diag.outputs.html_charts import Chart
    from tests.conftest import RunWriter

    path = failure_run(RunWriter(tmp_path), "hang")
    run = load_any(path)
    metrics, report = diagnose(run)
    charts = report_charts(run, metrics, report)
    assert charts[0][0] == "the collective the job stopped in"
    page = render_html(report, [Chart(s, f) for s, f in charts], plotly_js_gzip())
    assert page.index("where each rank stopped") < page.index("where the step goes")
    assert "stuck: all_reduce #7 of dp, step 6" in page
    div = str(overview.layout(LoadedRun("hang", run, metrics, report), []))
    assert div.index("HUNG: rank 2 never joined") < div.index("findings")
    assert "overview-stopped" in div and "overview-stuck" in div


def test_a_rank_whose_peers_raised_long_before_their_timeout_died(tmp_path: Path) -> None:
    """Rank 2 killed, no launcher's signal recorded: the others raised in the all-reduce it
    never joined 20 ms in, where their Flight Recorder says the group's timeout is 10 s. A hung
    peer lets the timeout run out; a dead one resets the connection at once: rank 2 died
    (FLR004, failed), not hung. The same records with the waiters raising at their 3 s
    timeout stay a hang of rank 2."""
    from tests.conftest import RunWriter

    report = analyze_path(failure_run(RunWriter(tmp_path), "killed-fr", name="killed"))
    first = report["findings"][0]
    assert (first["rule"], first["ranks"]) == ("FLR004", [2]), first["title"]
    assert report["summary"]["status"] == "failed"
    reason = report["summary"]["status_reason"]
    assert reason.startswith(
        "rank 2 died: ranks 0, 1, 3 raised in all_reduce #7 of dp after 0.02"
    ), reason
    assert "of a 10 s timeout" in reason
    hung = analyze_path(failure_run(RunWriter(tmp_path), "timeout-hang-fr", name="hung"))
    first = hung["findings"][0]
    assert (first["rule"], first["ranks"]) == ("FLR001", [2]), first["title"]
    assert hung["summary"]["status"] == "hung", hung["summary"]["status_reason"]


@pytest.mark.parametrize(
    ("kind", "status", "said"),
    [("completed", "completed", "every rank with records closed complete; rank 2 left no records"),
     ("crash", "hung", "rank 2, which left no records, never joined all_reduce #7 of dp"),
     ("lost", "hung", "rank 2, which left no records, never joined all_reduce #7 of dp")],
)  # fmt: skip
def test_a_rank_whose_file_is_missing_is_unknown_not_stopped(
    tmp_path: Path, kind: str, status: str, said: str
) -> None:
    """A rank file lost (a node's disk, a copy cut short) says nothing of where its rank
    stopped: before, a completed job read `undecidable: rank 2 stops before the others (at
    step None)`, and a crash or a kill read as rank 2 hanging, said as fact."""
    from tests.conftest import RunWriter

    path = failure_run(RunWriter(tmp_path), kind, name=kind)
    (path / "rank-00002.jsonl").unlink()
    report = analyze_path(path)
    summary = report["summary"]
    assert summary["status"] == status, summary["status_reason"]
    assert summary["status_reason"].startswith(said), summary["status_reason"]
    if status == "hung":
        first = report["findings"][0]
        assert first["rule"] == "FLR001"
        assert "hung, crashed or died, no record says" in first["title"]


def test_a_receive_waits_for_a_peer_the_data_does_not_show_by_elimination() -> None:
    """A stage's receive waits for a peer: one that waits in an op of its own is a link of the
    chain, one with no op is the cause; a peer without a rank file (or dump) is named by
    elimination and marked unseen (the finding says that no record says more)."""
    from diag.metrics.failure_records import Issued, RankRecords
    from diag.metrics.failure_stuck import stuck_p2p

    recv = Issued(1, "pp", 4, "recv", 64, "float32", 3, run_ns(0), (0, 1), "records", peer=0)
    ranks = {0: RankRecords(), 1: RankRecords()}
    (shown,) = stuck_p2p([recv], ranks, 0.0, {0, 1})
    assert (shown.missing, shown.unseen) == ([0], [])
    (unseen,) = stuck_p2p([recv], ranks, 0.0, {1})
    assert (unseen.missing, unseen.unseen) == ([0], [0])
