"""`diag export RUN --perfetto OUT.json.gz`: the file is read back with diag's own profiler-trace
reader (diag/read/kineto/files.py) and every span and collective keeps its time to the nanosecond
and its rank; every event passes a schema check of the Trace Event Format; the arrows start at the
last arrival; the findings sit on the ranks they blame; `--steps` keeps a window."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from diag import diagnose, load_any
from diag.cli.main import main
from diag.read.kineto.files import read_trace

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden-runs"
REAL_TRACES = ROOT.parent / "shared" / "real-traces"
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def _export(run: Path, out: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["export", str(run), "--perfetto", str(out), *args])
    assert result.exit_code == 0, result.output
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "rt", encoding="utf-8") as fh:
        return dict(json.load(fh))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The golden DP-with-a-straggler and pipeline runs, copied (no cache lands in tests/data)
    and exported."""
    folder = tmp_path_factory.mktemp("perfetto")
    out = {}
    for name in ("dp-straggler", "pp", "ep"):
        run = shutil.copytree(GOLDEN / name, folder / name)
        path = folder / f"{name}.json.gz"
        out[name] = (path, _export(run, path))
    return out


def check_event(event: dict[str, Any]) -> None:
    """One event against the Trace Event Format (the fields Perfetto and chrome://tracing read)."""
    phase = event["ph"]
    assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
    assert isinstance(event["name"], str) and event["name"], event
    if phase == "M":
        assert event["name"] in METADATA and isinstance(event["args"], dict), event
        return
    assert isinstance(event["ts"], float | int) and not isinstance(event["ts"], bool), event
    if phase == "X":
        assert isinstance(event["dur"], float | int) and event["dur"] >= 0, event
        assert event["cat"] in ("span", "collective"), event
        assert event["args"]["rank"] == event["pid"], event
    elif phase == "C":
        values = event["args"]
        assert values and all(isinstance(v, float | int) for v in values.values()), event
    elif phase in ("s", "f"):
        assert isinstance(event["id"], int) and event["cat"] in ("arrival", "message"), event
        assert phase == "s" or event["bp"] == "e", event
    elif phase == "i":
        assert event["s"] in ("t", "g") and event["cat"] == "finding", event
    else:
        raise AssertionError(f"unexpected phase {phase!r}: {event}")


@pytest.mark.parametrize("name", ["dp-straggler", "pp", "ep"])
def test_every_event_passes_the_schema(exported: dict[str, Any], name: str) -> None:
    _, document = exported[name]
    assert document["otherData"]["schema"] == "diag.perfetto/1"
    events = document["traceEvents"]
    for event in events:
        check_event(event)
    phases = Counter(e["ph"] for e in events)
    assert {"M", "X", "C", "s", "f"} <= set(phases)
    assert phases["s"] == phases["f"]
    # every flow: one start and one end, the end inside a slice of its own track
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    ends = [e for e in events if e["ph"] == "f"]
    assert sorted(e["id"] for e in ends) == sorted(e["id"] for e in events if e["ph"] == "s")
    for end in ends:
        track = slices[(end["pid"], end["tid"])]
        assert any(a <= end["ts"] <= b for a, b in track), end


@pytest.mark.parametrize("name", ["dp-straggler", "pp", "ep"])
def test_the_round_trip_keeps_every_span_and_collective(
    exported: dict[str, Any], name: str
) -> None:
    path, document = exported[name]
    origin_ns = document["otherData"]["origin_ns"]
    trace, notes = read_trace(path)  # diag's own Kineto reader
    assert notes == []

    def back(cat: str) -> list[tuple[Any, ...]]:
        return sorted(
            (e.args["rank"], e.args["step"], e.args.get("phase") or e.args.get("op"),
             origin_ns + round(e.ts * 1000), origin_ns + round((e.ts + e.dur) * 1000))
            for e in trace.traceEvents if e.ph == "X" and e.cat == cat
        )  # fmt: skip

    run = load_any(GOLDEN / name)

    def source(table: pd.DataFrame, label: str) -> list[tuple[Any, ...]]:
        return sorted(
            zip(table["rank"].astype(int), table["step"].astype(int), table[label].astype(str),
                table["t0"].astype(int), table["t1"].astype(int), strict=True)
        )  # fmt: skip

    assert back("span") == source(run.spans, "phase")
    assert back("collective") == source(run.comms, "op")


def test_processes_are_named_by_rank_host_and_stage(exported: dict[str, Any]) -> None:
    names = {
        e["pid"]: e["args"]["name"]
        for e in exported["pp"][1]["traceEvents"]
        if e["name"] == "process_name"
    }
    assert names == {0: "rank 0 (host vm, stage 0)", 1: "rank 1 (host vm, stage 1)"}
    threads = {e["args"]["name"] for e in exported["pp"][1]["traceEvents"]
               if e["name"] == "thread_name"}  # fmt: skip
    assert {"compute", "collectives", "findings"} <= threads


def test_arrows_start_at_the_straggler_and_findings_sit_on_it(exported: dict[str, Any]) -> None:
    events = exported["dp-straggler"][1]["traceEvents"]
    starts = Counter(e["pid"] for e in events if e["ph"] == "s" and e["cat"] == "arrival")
    assert starts and starts.most_common(1)[0][0] == 1  # rank 1 is late to the all-reduces
    run = load_any(GOLDEN / "dp-straggler")
    findings = diagnose(run)[1]["findings"]
    straggler = next(f for f in findings if f["rule"] == "BAL001")
    instants = [e for e in events if e["ph"] == "i" and e["name"].startswith("BAL001")]
    assert [e["pid"] for e in instants] == straggler["ranks"] == [1]
    assert instants[0]["args"]["advice"] == straggler["advice"]


def test_pipeline_messages_are_arrows_from_send_to_recv(exported: dict[str, Any]) -> None:
    events = exported["pp"][1]["traceEvents"]
    by_id: dict[int, dict[str, dict[str, Any]]] = {}
    for e in events:
        if e["ph"] in ("s", "f") and e["cat"] == "message":
            by_id.setdefault(e["id"], {})[e["ph"]] = e
    assert by_id
    for pair in by_id.values():
        assert pair["s"]["pid"] != pair["f"]["pid"]  # from one stage to the other


def test_memory_counters_hold_the_categories(exported: dict[str, Any]) -> None:
    counters = [e for e in exported["pp"][1]["traceEvents"] if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {0, 1}
    assert {"params", "grads", "optimizer", "activations"} <= set(counters[0]["args"])


def test_a_window_of_steps_keeps_only_those(tmp_path: Path) -> None:
    run = shutil.copytree(GOLDEN / "dp-straggler", tmp_path / "run")
    whole = _export(run, tmp_path / "all.json")
    window = _export(run, tmp_path / "window.json", "--steps", "1:2")
    steps = {e["args"]["step"] for e in window["traceEvents"] if e["ph"] == "X"}
    assert steps == {1}
    assert window["otherData"]["steps"] == [1, 2]
    assert len(window["traceEvents"]) < len(whole["traceEvents"])


def test_an_unwritable_output_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "out.json.gz"
    result = CliRunner().invoke(main, ["export", str(GOLDEN / "dp"), "--perfetto", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"diag: error: {out}: cannot write")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.skipif(not REAL_TRACES.is_dir(), reason="the real Kineto traces are not here")
def test_a_real_profiler_trace_folder_exports_its_kernels(tmp_path: Path) -> None:
    folder = shutil.copytree(REAL_TRACES / "hta-nccl-world2", tmp_path / "traces")
    path = tmp_path / "out.json.gz"
    document = _export(folder, path)
    for event in document["traceEvents"]:
        check_event(event)
    run = load_any(folder)
    kernels = [e for e in document["traceEvents"] if e["ph"] == "X" and e["cat"] == "span"]
    assert len(kernels) == len(run.spans) > 0
    assert {e["pid"] for e in kernels} == set(run.spans["rank"].astype(int))
