"""`diag analyze --scheduler`: the per-file work on a real Dask cluster (a `LocalCluster` of two
worker processes here) gives the local analysis's report exactly, for a run directory, a
profiler trace folder and a simulated 64-rank one (each worker reading its own files); without a
scheduler nothing of Dask is imported.

The cluster runs in a child process: under pytest the folder tests/distributed/ (the gloo
tests) is importable as `distributed` and shadows Dask's package of that name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diag.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "data" / "golden-runs" / "dp-profiled" / "traces"


def _cluster_job(run: str, traces: str, wide: str) -> dict[str, Any]:
    """In the child: each input analysed cold locally and on a 2-worker LocalCluster (through
    the API and through the CLI option); what the test compares."""
    from distributed import Client, LocalCluster, get_task_stream

    from diag.api import analyze_path
    from diag.read.parallel import using_scheduler

    out: dict[str, Any] = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit="2GiB") as cluster:  # fmt: skip
        address = cluster.scheduler_address
        inputs = (("run", Path(run)), ("traces", Path(traces)), ("wide", Path(wide)))
        for name, source in inputs:
            local, remote, cli = (shutil.copytree(source, source.parent / f"{name}-{k}")
                                  for k in ("local", "cluster", "cli"))  # fmt: skip
            # each analysed cold: a cache written by one must not serve another
            out[f"{name}_local"] = analyze_path(local)
            with (Client(address) as watcher, get_task_stream(client=watcher) as stream,
                  using_scheduler(address)):  # fmt: skip
                out[f"{name}_cluster"] = analyze_path(remote)
            out[f"{name}_parsed_by"] = sorted(
                {task["worker"] for task in stream.data if "parse_chunk" in task["key"]}
            )
            if name == "run":  # the option itself, once
                result = CliRunner().invoke(main, ["analyze", str(cli), "--format", "json",
                                                   "--scheduler", address])  # fmt: skip
                assert result.exit_code == 0, result.output
                out[f"{name}_cli"] = json.loads(result.stdout)
        out.update(_reduced_on_the_cluster(address, Path(wide)))
        with Client(address) as client:
            prefixes = client.run_on_scheduler(
                lambda dask_scheduler: list(dask_scheduler.task_prefixes)
            )
            out["task_prefixes"] = sorted(map(str, prefixes))
            out["loops_in_worker"] = client.submit(_reduced_in_a_worker, run, pure=False).result()
    return out


def _reduced_on_the_cluster(address: str, wide: Path) -> dict[str, Any]:
    """(In the child) the 64-rank folder analysed as a large one (the threshold patched to 0):
    locally (spilled to disk, reduced by local workers) and on the cluster (each trace kept
    and reduced by the worker that parsed it); what the client did with packed records."""
    from distributed import Client, get_task_stream

    import diag.read.kineto as kineto
    from diag.api import analyze_path
    from diag.read import distributed_scheduler
    from diag.read.parallel import using_scheduler

    kineto.REDUCE_SPANS_FROM_BYTES = 0
    here: dict[str, int] = {"reduce_traces": 0, "fetch": 0}

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            here[name] += 1
            return real(*args, **kwargs)

        return call

    # the client reducing traces itself, or bringing a kept trace's records over
    kineto.reduce_traces = counted("reduce_traces", kineto.reduce_traces)
    keeper = distributed_scheduler.KeptOnCluster
    keeper.fetch = counted("fetch", keeper.fetch)  # type: ignore[method-assign]
    local, remote = (shutil.copytree(wide, wide.parent / f"reduced-{k}") for k in ("l", "c"))

    def analysed(folder: Path) -> dict[str, Any]:  # the notes name the folder: not compared
        text = json.dumps(analyze_path(folder)).replace(str(folder), "FOLDER")
        return json.loads(text)  # type: ignore[no-any-return]

    out: dict[str, Any] = {"reduced_local": analysed(local)}
    with (Client(address) as watcher, get_task_stream(client=watcher) as stream,
          using_scheduler(address)):  # fmt: skip
        out["reduced_cluster"] = analysed(remote)
    out["reduced_by"] = sorted(
        {task["worker"] for task in stream.data if "reduce_kept" in task["key"]}
    )
    out["reduce_tasks"] = sum("reduce_kept" in task["key"] for task in stream.data)
    out["client_work"] = dict(here)
    # traces whose ops' naming reads other traces' (batched kernels: here, said so of every
    # trace) are brought to the client and reduced there, as a local analysis reads them back
    real_kept, kineto._kept = kineto._kept, _said_batched
    remote = shutil.copytree(wide, wide.parent / "reduced-batched")
    with using_scheduler(address):
        out["read_back"] = analysed(remote)
    kineto._kept = real_kept
    out["client_work_read_back"] = {name: here[name] - out["client_work"][name] for name in here}
    return out


def _said_batched(chunk: list[Any], index: int) -> list[Any]:
    """(On a cluster worker) `kineto._kept`, every trace said to hold a batched kernel."""
    import diag.read.kineto as kineto

    out = kineto._kept(chunk, index)
    for _, _, comms in out:
        comms.batched = True
    return out


def _reduced_in_a_worker(run: str) -> list[str]:
    """On a cluster worker: a chunk of rank files read and reduced as a large run's are;
    the compiled loops loaded in that worker afterwards."""
    from diag.metrics.file_reduction import reduce_rank_files
    from diag.numeric import compiled
    from diag.read.load import read_rank_chunk

    files = [(rank, Path(run) / f"rank-{rank:05d}.arrows") for rank in (0, 1)]
    read_rank_chunk(files, reduce_rank_files)
    return sorted(loop.__name__ for loop in compiled._loaded)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("dask")
    root = tmp_path_factory.mktemp("dask")
    run = root / "run"
    result = CliRunner().invoke(main, [
        "simulate", "--layout", "dp=2,tp=2,pp=2", "--microbatches", "4", "--steps", "4",
        "--gpus-per-node", "4", "--format", "arrow", "--inject", "straggler:rank=3,ms=20",
        "--out", str(run),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    traces = shutil.copytree(TRACES, root / "traces", ignore=shutil.ignore_patterns(".diag-cache"))
    wide = root / "wide"  # 64 ranks' profiler traces, 3 steps (4 MB)
    result = CliRunner().invoke(main, [
        "simulate", "--ranks", "64", "--layout", "dp=16,pp=4", "-m", "4", "--steps", "3",
        "--format", "kineto", "--out", str(wide),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    code = (
        "import json, sys\n"
        "from tests.unit.test_dask_scheduler import _cluster_job\n"
        f"json.dump(_cluster_job({str(run)!r}, {str(traces)!r}, {str(wide)!r}), sys.stdout)\n"
    )
    env = {**os.environ, "DASK_SCHEDULER_ADDRESS": ""}
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=600, cwd=ROOT, env=env)  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    reports: dict[str, Any] = json.loads(child.stdout)
    reports["run_dir"] = str(run)
    return reports


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    a, b = json.loads(json.dumps(a)), json.loads(json.dumps(b))
    for report in (a, b):
        report["run"].pop("run_id", None)  # the copies' folder names
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_run_directory_on_the_cluster_equals_local(reports: dict[str, Any]) -> None:
    assert _same(reports["run_cluster"], reports["run_local"])
    assert _same(reports["run_cli"], reports["run_local"])
    assert reports["run_local"]["findings"]


def test_trace_folder_on_the_cluster_equals_local(reports: dict[str, Any]) -> None:
    assert _same(reports["traces_cluster"], reports["traces_local"])


def test_a_64_rank_trace_folder_on_the_cluster_equals_local(reports: dict[str, Any]) -> None:
    assert _same(reports["wide_cluster"], reports["wide_local"])
    assert reports["wide_local"]["run"]["world_size"] == 64
    # each of the two workers parsed trace files of its own
    assert len(reports["wide_parsed_by"]) == 2, reports["wide_parsed_by"]


def test_a_large_trace_folder_is_reduced_by_the_cluster_workers_as_locally(
    reports: dict[str, Any],
) -> None:
    """Issue 43: a large folder's traces stay with the worker that parsed them and are reduced
    there; the client holds what the local path's gathering process holds, and the report is
    the local one."""
    local, cluster = reports["reduced_local"], reports["reduced_cluster"]
    assert any("the spans and collectives themselves" in n for n in local["skipped"])
    assert _same(cluster, local)
    assert reports["reduce_tasks"] == 64  # one a trace
    assert len(reports["reduced_by"]) == 2, reports["reduced_by"]
    assert reports["client_work"] == {"reduce_traces": 0, "fetch": 0}
    # where the client must read every trace's ops, they come over and it reduces them
    assert _same(reports["read_back"], local)
    assert reports["client_work_read_back"] == {"reduce_traces": 1, "fetch": 64}


def test_the_cluster_did_the_per_file_work(reports: dict[str, Any]) -> None:
    prefixes = reports["task_prefixes"]
    assert "read_rank_chunk" in prefixes and "parse_chunk" in prefixes, prefixes


def test_a_cluster_worker_reduces_with_the_compiled_loops(reports: dict[str, Any]) -> None:
    # a local worker inherits them from the loader; a cluster worker loads them itself, or a
    # large run of small files is reduced as Python there (6x the local time at 16,384 ranks)
    assert {"_window_unions_loop", "_summed_by_key"} <= set(reports["loops_in_worker"])


def test_a_local_analysis_imports_nothing_of_dask(reports: dict[str, Any], tmp_path: Path) -> None:
    run = shutil.copytree(reports["run_dir"], tmp_path / "run")
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from diag.cli.main import main\n"
        f"r = CliRunner().invoke(main, ['analyze', {str(run)!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))\n"
    )
    env = {**os.environ, "DASK_SCHEDULER_ADDRESS": ""}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=ROOT, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
