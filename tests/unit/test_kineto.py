"""Kineto trace folders: small hand-written traces (every number checkable by hand) for the
loader's rules, then every real trace folder in ../shared/real-traces (skipped when absent)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import click
import pandas as pd
import pytest

from diag.api import analyze_path, diagnose, load_any
from diag.cli.shell import parse_layout
from diag.errors import InputError
from diag.metrics import compute_metrics
from diag.read.kineto import KernelPatterns, is_trace_dir, load_trace_dir

REAL_TRACES = Path(__file__).parents[3] / "shared" / "real-traces"
US = 1.0  # Kineto times are microseconds


def _x(name: str, cat: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0, "tid": 1,
            "args": args}  # fmt: skip


def _trace(rank: int | None, world: int = 2, events: list[dict[str, Any]] | None = None) -> dict:
    data: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events or []}
    if rank is not None:
        data["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    return data


def _step_events(offset_us: float = 0.0, comm_dur: float = 40.0) -> list[dict[str, Any]]:
    """One ProfilerStep#3 (CPU 0-100 us) launching: a GEMM 10-60 us, an NCCL all-reduce
    40-40+comm_dur us (100 float elements through record_param_comms), a memcpy 90-95 us."""
    o = offset_us
    return [
        _x("ProfilerStep#3", "user_annotation", o + 0, 100),
        _x("cudaLaunchKernel", "cuda_runtime", o + 1, 1, correlation=11),
        _x(
            "record_param_comms",
            "cpu_op",
            o + 2,
            5,
            **{
                "Collective name": "allreduce",
                "In msg nelems": 100,
                "Out msg nelems": 100,
                "dtype": "Float",
                "Process Group Description": "default_pg",
                "Group size": 2,
            },
        ),
        _x("cudaLaunchKernel", "cuda_runtime", o + 3, 1, correlation=12),
        _x("cudaMemcpyAsync", "cuda_runtime", o + 4, 1, correlation=13),
        _x("sm90_xmma_gemm_bf16", "kernel", o + 10, 50, correlation=11, stream=7),
        _x(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
            "kernel",
            o + 40,
            comm_dur,
            correlation=12,
            stream=20,
        ),
        _x("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", o + 90, 5, correlation=13, stream=7),
    ]


def _write(folder: Path, name: str, data: dict, compress: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    text = json.dumps(data)
    if compress:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def test_one_step_by_hand(tmp_path: Path) -> None:
    _write(tmp_path, "a.pt.trace.json", _trace(0, events=_step_events()))
    _write(tmp_path, "b.pt.trace.json.gz", _trace(1, events=_step_events()), compress=True)
    assert is_trace_dir(tmp_path)
    run = load_trace_dir(tmp_path)
    assert run.manifest.world_size == 2 and run.manifest.trainer == "kineto"
    steps = run.steps[run.steps["rank"] == 0].iloc[0]
    assert (steps["step"], steps["t0"], steps["t1"]) == (3, 10_000, 95_000)  # device window, ns
    comm = run.comms[run.comms["rank"] == 0].iloc[0]
    assert (comm["op"], comm["group"], comm["bytes"], comm["dtype"]) == (
        "all_reduce",
        "default_pg",
        400,
        "float",
    )
    waits = run.spans[(run.spans["rank"] == 0) & (run.spans["phase"] == "comm_wait")]
    assert waits[["t0", "t1"]].values.tolist() == [[60_000, 80_000]]  # comm 40-80, GEMM to 60
    metrics = compute_metrics(run)
    row = metrics.rank_steps.iloc[0]
    # window 85 us: busy = GEMM 50 + memcpy 5, exposed comm 20, idle 10 (80-90)
    assert (row["wall_s"], row["busy_s"], row["exposed_comm_s"], row["idle_s"]) == pytest.approx(
        (85e-6, 55e-6, 20e-6, 10e-6)
    )
    assert metrics.summary["hidden_comm_share"] == pytest.approx(0.5)


def test_rank_from_the_file_name_and_errors_that_list_files(tmp_path: Path) -> None:
    _write(tmp_path / "named", "worker_rank-3.json", _trace(None, events=_step_events()))
    run = load_trace_dir(tmp_path / "named")
    assert run.steps["rank"].unique().tolist() == [3] and run.manifest.world_size == 4
    _write(tmp_path / "twice", "x.json", _trace(1, events=_step_events()))
    _write(tmp_path / "twice", "y.json", _trace(1, events=_step_events()))
    with pytest.raises(
        InputError, match=r"several trace files claim rank 1 \(x.json, y.json\) and their"
    ):
        load_trace_dir(tmp_path / "twice")
    _write(tmp_path / "anon", "p.json", _trace(None, events=_step_events()))
    _write(tmp_path / "anon", "q.json", _trace(None, events=_step_events()))
    with pytest.raises(InputError, match=re.escape("cannot tell the rank of p.json, q.json")):
        load_trace_dir(tmp_path / "anon")


def test_a_lone_trace_without_rank_is_rank_0_with_a_note(tmp_path: Path) -> None:
    _write(tmp_path, "trace.json", _trace(None, events=_step_events()))
    run = load_trace_dir(tmp_path)
    assert run.steps["rank"].tolist() == [0]
    assert any("taken as rank 0" in note for note in run.skipped)


@pytest.mark.parametrize(
    ("group_args", "world"),
    [({"Process Group Ranks": "[0, 1, 2, 3]", "Group size": 4}, 4), ({"Group size": 8}, 8),
     ({}, 1)],
    ids=["ranks", "size", "none"],
)  # fmt: skip
def test_without_distributed_info_the_world_is_what_the_collectives_groups_show(
    tmp_path: Path, group_args: dict[str, Any], world: int
) -> None:
    """No distributedInfo is no world of one: the collectives' process groups (their ranks, or
    their sizes where a trace gives no ranks) say how many ranks the job had at least, and a
    note says so; a trace whose collectives say nothing stays a job of its ranks."""
    events = _step_events()
    for event in events:
        if event["name"] == "record_param_comms":
            del event["args"]["Group size"]
            event["args"].update(group_args)
    _write(tmp_path, "trace.json", _trace(None, events=events))
    run = load_trace_dir(tmp_path, use_cache=False)
    assert run.manifest.world_size == world
    said = [note for note in run.skipped if "process groups of its collectives show" in note]
    assert len(said) == (world > 1), run.skipped
    if world > 1:
        assert f"traces of 1 of {world} ranks" in " ".join(run.skipped)


@pytest.mark.skipif(not REAL_TRACES.is_dir(), reason="no ../shared/real-traces")
def test_a_real_nccl_trace_without_distributed_info_is_one_of_its_jobs_ranks(
    tmp_path: Path,
) -> None:
    """hta-nccl-world2's trace with its distributedInfo removed (as some exporters and older
    profilers leave it): its all-reduces' group lists ranks 0-1, so it is one rank of two, not
    a job of one; a layout of two ranks given on the command line is accepted."""
    from diag.contract import schema
    from diag.outputs.report_lines import headline

    (source,) = (REAL_TRACES / "hta-nccl-world2").glob("*.json*")
    with gzip.open(source, "rt") as fh:
        data = json.load(fh)
    data.pop("distributedInfo")
    _write(tmp_path, "trace.json", data)
    run = load_trace_dir(tmp_path, use_cache=False)
    assert run.manifest.world_size == 2 and run.manifest.layout.dp == 2
    line = headline(diagnose(run)[1])
    assert line.startswith(f"{tmp_path.name}  1 of 2 ranks"), line
    given = load_trace_dir(tmp_path, layout=schema.Layout(dp=2), use_cache=False)
    assert given.manifest.world_size == 2


def test_a_window_without_profiler_steps_is_one_step_and_says_so(tmp_path: Path) -> None:
    """Without `ProfilerStep#N` (the profiler's step() not called) the window is step 0 whole,
    however many iterations it holds: a note says so, not a step time that silently is the
    window's; a trace with its steps says nothing of the kind."""
    two_steps = _step_events() + _step_events(offset_us=200)
    unmarked = [e for e in two_steps if not e["name"].startswith("ProfilerStep")]
    _write(tmp_path / "unmarked", "rank0.json", _trace(0, world=1, events=unmarked))
    _write(tmp_path / "marked", "rank0.json", _trace(0, world=1, events=_step_events()))
    run = load_trace_dir(tmp_path / "unmarked", use_cache=False)
    assert run.steps["step"].tolist() == [0]
    assert any("no ProfilerStep#N annotation" in note for note in run.skipped), run.skipped
    marked = load_trace_dir(tmp_path / "marked", use_cache=False)
    assert not any("ProfilerStep" in note for note in marked.skipped), marked.skipped


def test_device_events_without_their_launches_are_said_not_read_as_no_host_wait(
    tmp_path: Path,
) -> None:
    """A trace without CUDA runtime events (filtered, or exported without them) has its
    kernels but not when the host launched them: the device's idle time cannot be split into
    waiting for the host and waiting on a dependency, so it is not measured (a split would
    read the host's share as 0) and a note says so."""
    unlaunched = [e for e in _step_events() if e["cat"] != "cuda_runtime"]
    _write(tmp_path / "unlaunched", "rank0.json", _trace(0, world=1, events=unlaunched))
    _write(tmp_path / "launched", "rank0.json", _trace(0, world=1, events=_step_events()))
    run = load_trace_dir(tmp_path / "unlaunched", use_cache=False)
    assert run.device_time.empty
    assert any("none of their launches" in note for note in run.skipped), run.skipped
    launched = load_trace_dir(tmp_path / "launched", use_cache=False)
    assert not launched.device_time.empty
    assert not any("launches" in note for note in launched.skipped), launched.skipped


def _numbered(step: int, offset_us: float = 0.0) -> list[dict[str, Any]]:
    """`_step_events` as ProfilerStep#`step`, its correlation ids its own."""
    events = [{**e, "args": dict(e["args"])} for e in _step_events(offset_us)]
    events[0]["name"] = f"ProfilerStep#{step}"
    for event in events:
        if "correlation" in event["args"]:
            event["args"]["correlation"] += 100 * step
    return events


def test_a_rank_whose_step_numbers_meet_no_others_is_left_out_not_read_as_stopping_early(
    tmp_path: Path,
) -> None:
    """Ranks 0 and 2 profiled steps 3-4, rank 1 numbered the same iterations 30-31 (its
    profiler counted from elsewhere): compared by number, the others read as stopping 27
    steps early, a hang named where none was. It is left out with a note naming
    its steps; a rank whose steps overlap the others' in part (rank 3: 4-5) stays, and is read
    as the others are."""
    for rank, (a, b) in {0: (3, 4), 1: (30, 31), 2: (3, 4), 3: (4, 5)}.items():
        events = _numbered(a) + _numbered(b, offset_us=200)
        _write(tmp_path, f"rank{rank}.json", _trace(rank, world=4, events=events))
    run = load_trace_dir(tmp_path, use_cache=False)
    assert sorted(run.steps["rank"].unique().tolist()) == [0, 2, 3]
    said = [note for note in run.skipped if "ProfilerStep numbers of rank 1" in note]
    assert len(said) == 1 and "30-31" in said[0] and "steps 3-5" in said[0], run.skipped
    # rank 3, one step ahead, shows ranks 0 and 2 stopping before it (hung, died or cut
    # short: undecidable); rank 1, left out, is unseen, not one that stopped at no step
    (failure,) = [f for f in diagnose(run)[1]["findings"] if f["rule"].startswith("FLR")]
    assert failure["ranks"] == [0, 2] and "rank 1" not in failure["title"], failure["title"]


def test_truncated_file_is_skipped_with_a_note_and_the_rest_analysed(tmp_path: Path) -> None:
    _write(tmp_path, "rank0.json", _trace(0, events=_step_events()))
    good = gzip.compress(json.dumps(_trace(1, events=_step_events())).encode())
    (tmp_path / "rank1.json.gz").write_bytes(good[: len(good) // 2])
    report = analyze_path(tmp_path)
    assert report["summary"]["ranks_analysed"] == 1
    assert any("rank1.json.gz" in note and "truncated" in note for note in report["skipped"])
    (tmp_path / "rank0.json").write_text('{"traceEvents": [')
    with pytest.raises(InputError, match="no readable Kineto trace"):
        load_trace_dir(tmp_path)


def test_deepep_kernels_are_communication_and_patterns_are_configurable(tmp_path: Path) -> None:
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 100),
        _x("void dpsk::ep::internode::dispatch<false, 8>(int4*)", "kernel", 10, 30, stream=3),
        _x("my_fused_gemm", "kernel", 0, 50, stream=7),
    ]
    _write(tmp_path, "rank0.json", _trace(0, 1, events))
    run = load_trace_dir(tmp_path)
    assert run.comms["op"].tolist() == ["all_to_all"] and run.comms["bytes"].isna().all()
    plain = load_trace_dir(tmp_path, KernelPatterns(comm=(r"^nccl",)))
    assert plain.comms.empty  # as a tool that only knows NCCL names sees it


def test_a_folder_without_traces_or_manifest_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError) as info:
        load_any(tmp_path)
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


# --- Real traces --------------------------------------------------------------------------------

REAL_FOLDERS = sorted(
    p for p in (REAL_TRACES.iterdir() if REAL_TRACES.is_dir() else []) if is_trace_dir(p)
)


@pytest.mark.skipif(not REAL_FOLDERS, reason="../shared/real-traces is absent")
@pytest.mark.parametrize("folder", REAL_FOLDERS, ids=lambda p: p.name)
def test_every_real_trace_folder_analyses(folder: Path) -> None:
    report = analyze_path(folder)
    assert report["summary"]["steps_analysed"] >= 1
    assert report["ranks"], folder


@pytest.mark.skipif(not (REAL_TRACES / "deepseek-v3-train-ep64").is_dir(), reason="absent")
def test_deepseek_all_to_all_is_mostly_hidden_under_compute() -> None:
    report = analyze_path(REAL_TRACES / "deepseek-v3-train-ep64")
    summary = report["summary"]
    assert summary["comm_share"] > 0.5  # DeepEP kernels run most of the step, on a side stream
    assert summary["hidden_comm_share"] > 0.9  # and compute hides nearly all of it
    (a2a,) = [c for c in report["collectives"] if c["op"] == "all_to_all"]
    assert a2a["count"] > 0


@pytest.mark.skipif(not (REAL_TRACES / "hta-nccl-world2").is_dir(), reason="absent")
def test_nccl_bytes_come_from_record_param_comms() -> None:
    report = analyze_path(REAL_TRACES / "hta-nccl-world2")
    ops = {c["op"]: c for c in report["collectives"]}
    # the world's group, carrying DDP's gradient buckets: named by its axis, not `default_pg`
    assert ops["all_reduce"]["group"] == "dp" and ops["all_reduce"]["bytes"] > 0
    assert ops["all_reduce"]["busbw_GBps"] > 0


# --- Parallel parsing and the cache -------------------------------------------------------------


def _two_ranks(folder: Path) -> None:
    _write(folder, "rank0.json", _trace(0, events=_step_events()))
    _write(folder, "rank1.json", _trace(1, events=_step_events(comm_dur=60.0)))


def test_parallel_parsing_gives_the_serial_result(tmp_path: Path) -> None:
    _two_ranks(tmp_path)
    serial = load_trace_dir(tmp_path, use_cache=False, workers=1)
    parallel = load_trace_dir(tmp_path, use_cache=False, workers=2)
    for table in ("steps", "spans", "comms"):
        pd.testing.assert_frame_equal(getattr(serial, table), getattr(parallel, table))


def test_cache_beside_the_traces_serves_an_unchanged_folder(tmp_path: Path) -> None:
    _two_ranks(tmp_path)
    first = load_trace_dir(tmp_path)
    assert (tmp_path / ".diag-cache" / "kineto.json").is_file()
    again = load_trace_dir(tmp_path)
    pd.testing.assert_frame_equal(first.comms, again.comms)
    # a changed file changes the key: parsed again, the new comm duration shows
    _write(tmp_path, "rank1.json", _trace(1, events=_step_events(comm_dur=20.0)))
    changed = load_trace_dir(tmp_path)
    durations = changed.comms.assign(d=changed.comms["t1"] - changed.comms["t0"])["d"].tolist()
    assert durations == [40_000, 20_000]


def test_read_only_trace_folder_caches_in_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces, home = tmp_path / "traces", tmp_path / "home-cache"
    _two_ranks(traces)
    traces.chmod(0o555)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    try:
        load_trace_dir(traces)
        assert not (traces / ".diag-cache").exists()
        assert list(home.glob("diag/*/kineto.json"))
    finally:
        traces.chmod(0o755)


# --- HTA, reachable from the report -------------------------------------------------------------


@pytest.mark.skipif(not (REAL_TRACES / "hta-nccl-world2").is_dir(), reason="absent")
def test_hta_analyses_join_the_report_on_request() -> None:
    report = analyze_path(REAL_TRACES / "hta-nccl-world2", hta=True)
    (temporal,) = report["hta"]["temporal_breakdown"]
    # HTA's own figures on its own sample (../shared/real-traces/README.md)
    assert (temporal["idle_time_pctg"], temporal["compute_time_pctg"]) == (77.78, 17.26)
    assert report["hta"]["comm_comp_overlap"][0]["comp_comm_overlap_pctg"] == pytest.approx(14.31)
    assert "hta" not in analyze_path(REAL_TRACES / "hta-nccl-world2")


@pytest.mark.skipif(not (REAL_TRACES / "deepseek-v3-train-ep64").is_dir(), reason="absent")
def test_hta_blind_spot_on_deepep_is_said() -> None:
    report = analyze_path(REAL_TRACES / "deepseek-v3-train-ep64", hta=True)
    (temporal,) = report["hta"]["temporal_breakdown"]
    assert temporal["compute_time_pctg"] > 95  # HTA sees the all-to-all as computation
    assert report["summary"]["comm_share"] > 0.5  # diag sees it as communication
    assert any("DeepEP" in note for note in report["hta"]["notes"])


# --- Our device time against HTA's, on HTA's own samples ----------------------------------------

HTA_SAMPLES = [f for f in ("hta-nccl-world2", "hta-sampled-world128", "hta-alltoall-world16")
               if (REAL_TRACES / f).is_dir()]  # fmt: skip


@pytest.mark.skipif(not HTA_SAMPLES, reason="../shared/real-traces is absent")
@pytest.mark.parametrize("name", HTA_SAMPLES)
def test_device_time_agrees_with_hta_within_1_percent(name: str, tmp_path: Path) -> None:
    from diag.read.kineto.device import HTA_PATTERNS
    from diag.read.kineto.hta_bridge import hta_analyses

    ours = compute_metrics(load_trace_dir(REAL_TRACES / name, HTA_PATTERNS)).device
    theirs = hta_analyses(REAL_TRACES / name)
    temporal = {t["rank"]: t for t in theirs["temporal_breakdown"]}
    overlap = {o["rank"]: o["comp_comm_overlap_pctg"] for o in theirs["comm_comp_overlap"]}
    assert sorted(ours["rank"]) == sorted(temporal)
    for row in ours.to_dict("records"):
        hta = temporal[row["rank"]]
        assert row["kernel_time_s"] * 1e6 == pytest.approx(hta["kernel_time(us)"], rel=0.01)
        for ours_key, hta_key in (("idle_share", "idle_time(us)"),
                                  ("compute_share", "compute_time(us)"),
                                  ("non_compute_share", "non_compute_time(us)")):  # fmt: skip
            share = hta[hta_key] / hta["kernel_time(us)"]
            assert row[ours_key] == pytest.approx(share, rel=0.01, abs=1e-4), (ours_key, row)
        assert 100 * row["comm_overlap"] == pytest.approx(overlap[row["rank"]], rel=0.01, abs=0.01)


@pytest.mark.skipif(not (REAL_TRACES / "deepseek-v3-train-ep64").is_dir(), reason="absent")
def test_where_hta_is_blind_diag_sees_the_hidden_all_to_all() -> None:
    from diag.read.kineto.device import HTA_PATTERNS

    folder = REAL_TRACES / "deepseek-v3-train-ep64"
    as_hta = compute_metrics(load_trace_dir(folder, HTA_PATTERNS)).device.iloc[0]
    ours = compute_metrics(load_trace_dir(folder)).device.iloc[0]
    assert as_hta["comm_s"] == 0 and as_hta["compute_share"] > 0.99  # no communication at all
    assert ours["comm_s"] > 0.1 * ours["kernel_time_s"] and ours["comm_overlap"] > 0.9


def test_second_analysis_is_the_cached_report_for_the_same_traces_and_options(
    tmp_path: Path,
) -> None:
    _two_ranks(tmp_path)
    first = analyze_path(tmp_path)
    assert (tmp_path / ".diag-cache" / "report.json").is_file()
    assert analyze_path(tmp_path) == first
    assert "COM001" in [f["rule"] for f in first["findings"]]
    looser = analyze_path(tmp_path, {"COM001": {"medium": 0.9, "high": 0.95}})
    assert "COM001" not in [f["rule"] for f in looser["findings"]]  # other options: analysed
    _write(tmp_path, "rank1.json", _trace(1, events=_step_events(comm_dur=5.0)))
    assert analyze_path(tmp_path)["summary"] != first["summary"]  # changed traces: analysed anew


# --- The layout of a trace folder ---------------------------------------------------------------


def test_a_stated_layout_gives_stages_and_the_bubble_against_theory(tmp_path: Path) -> None:
    for rank in range(4):  # 4 ranks, one kernel each, stage s busy 20 of its 100 us window
        events = [_x("ProfilerStep#1", "user_annotation", 0, 200),
                  _x("cudaLaunchKernel", "cuda_runtime", 1, 1, correlation=5),
                  _x("gemm", "kernel", 20 * rank, 20, correlation=5, stream=7),
                  _x("cudaLaunchKernel", "cuda_runtime", 2, 1, correlation=6),
                  _x("gemm", "kernel", 100, 0.001, correlation=6, stream=7)]  # fmt: skip
        _write(tmp_path, f"rank{rank}.json", _trace(rank, 4, events))
    layout = parse_layout("pp=4,m=4")
    report = analyze_path(tmp_path, layout=layout)
    assert report["summary"]["bubble_theory"] == pytest.approx(3 / 7)
    assert [r["stage"] for r in report["ranks"]] == [0, 1, 2, 3]
    assert report["summary"]["bubble_fraction"] is not None
    with pytest.raises(InputError, match=r"dp x tp x pp x ep x cp = 2 is not the traces' world"):
        analyze_path(tmp_path, layout=parse_layout("pp=2"))
    with pytest.raises(click.BadParameter, match="unknown dimension 'dq'"):
        parse_layout("dq=2")


def test_a_runs_profiler_window_takes_the_runs_layout(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"schema": "diag.run/1", "run_id": "r", "created": "now", "world_size": 2,
         "layout": {"dp": 1, "pp": 2, "microbatches": 4}}
    ))  # fmt: skip
    _two_ranks(tmp_path / "traces")
    run = load_trace_dir(tmp_path / "traces")
    assert (run.manifest.layout.pp, run.manifest.layout.microbatches) == (2, 4)


def test_a_trace_the_typed_decoder_refuses_is_read_as_plain_json(tmp_path: Path) -> None:
    data = _trace(0, 1, _step_events())
    data["traceEvents"] = [7, "junk", *data["traceEvents"]]  # not objects: skipped
    (tmp_path / "rank0.json").write_text(json.dumps(data).replace('"dur": 5', '"dur": NaN', 1))
    run = load_trace_dir(tmp_path)
    assert run.comms["op"].tolist() == ["all_reduce"] and len(run.steps) == 1


def _on(tid: int, event: dict[str, Any]) -> dict[str, Any]:
    return {**event, "tid": tid}


def test_a_cpu_traces_step_thread_work_between_operators_is_busy(tmp_path: Path) -> None:
    """gloo on CPU, one step 0-1000 us on thread 1: operators at 10-100 and 300-400, nothing
    recorded 100-300 and 400-500 (Python, a sleep: the step's own work), an autograd
    operator 500-900 inside which the thread awaits a worker's all-reduce 550-850 (waiting,
    not work), and time before the first operator (a data fetch) left in no record."""
    events = [
        _on(1, _x("ProfilerStep#1", "user_annotation", 0, 1000)),
        _on(1, _x("aten::mm", "cpu_op", 10, 90)),
        _on(1, _x("aten::mm", "cpu_op", 300, 100)),
        _on(1, _x("autograd::engine::evaluate_function: MyBackward", "cpu_op", 500, 400)),
        _on(1, _x("c10d::allreduce_", "cpu_op", 540, 5)),
        _on(2, _x("gloo:all_reduce", "user_annotation", 550, 300)),
    ]
    _write(tmp_path, "rank0.pt.trace.json", _trace(0, world=1, events=events))
    run = load_trace_dir(tmp_path)
    busy = run.spans[run.spans["phase"] == "kernel"][["t0", "t1"]].values.tolist()
    assert busy == [[10_000, 550_000], [850_000, 900_000]]
    assert run.spans[run.spans["phase"] == "comm_wait"].empty
    comm = run.comms.iloc[0]
    assert (comm["t0"], comm["t1"], bool(comm["blocking"])) == (550_000, 850_000, True)
