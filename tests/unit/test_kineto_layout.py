"""The layout, the process groups and each communication kernel's op read from profiler traces
in the shapes real jobs write (issue 39): `distributedInfo.pg_config` with Megatron's or
DeviceMesh's names, `record_param_comms` with group arguments and the peers of sends and
receives (PyTorch 2.4's arg names, as in ../shared/real-traces/hta-nccl-world2), batched
point-to-point kernels launched after their ops' scopes closed, older traces with only an
`nccl:<op>` annotation (`Input Dims` / `Input type`, as hta-sampled-world128 writes), one rank
per tensor-parallel group traced; and the real traces of ../shared/real-traces."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import diag
from diag.contract.schema import Layout, Manifest
from diag.metrics.arrival import arrivals
from diag.outputs.report_lines import headline
from diag.read.kineto import load_trace_dir
from diag.read.kineto.comm_ops import group_ranks
from diag.read.kineto.files import pg_groups
from diag.read.kineto.layout import infer_layout

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "real-traces"
DP, PP, TP = 2, 2, 2
WORLD = DP * PP * TP
STEP_US = 1000
MEGATRON = {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP",
            "pp": "PIPELINE_MODEL_PARALLEL_GROUP"}  # fmt: skip
MESH = {"tp": "mesh_tp", "dp": "mesh_dp", "pp": "mesh_pp"}
SWAPPED = {"tp": "DATA_PARALLEL_GROUP", "dp": "TENSOR_MODEL_PARALLEL_GROUP",
           "pp": "EMBEDDING_GROUP"}  # fmt: skip


@dataclass(frozen=True)
class Job:
    """A dp x pp x tp job in Megatron's order (tp innermost, then dp, pp outermost): not
    diag's grid order (dp outermost), so nothing here can pass by assuming it."""

    dp: int = DP
    pp: int = PP
    tp: int = TP

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        return rank // (self.dp * self.tp), rank // self.tp % self.dp, rank % self.tp

    def groups_of(self, rank: int) -> dict[str, list[int]]:
        pp, dp, tp = self.coords(rank)
        size = self.dp * self.tp
        return {
            "tp": [pp * size + dp * self.tp + i for i in range(self.tp)],
            "dp": [pp * size + i * self.tp + tp for i in range(self.dp)],
            "pp": [i * size + dp * self.tp + tp for i in range(self.pp)],
        }

    def expected_groups(self) -> dict[str, list[tuple[int, ...]]]:
        return {axis: sorted({tuple(self.groups_of(r)[axis]) for r in range(self.world)})
                for axis in ("tp", "dp", "pp")}  # fmt: skip


JOB = Job()


def coords(rank: int) -> tuple[int, int, int]:
    return JOB.coords(rank)


def groups_of(rank: int) -> dict[str, list[int]]:
    return JOB.groups_of(rank)


class Trace:
    """One rank's events: steps, kernels launched from CPU ops, as torch.profiler writes."""

    def __init__(self, rank: int) -> None:
        self.rank, self.events, self.correlation = rank, [], 1000 * rank

    def x(self, name: str, cat: str, ts: float, dur: float, tid: int, **args: Any) -> None:
        event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
        self.events.append(event | ({"args": args} if args else {}))

    def launch(self, kernel: str, ts: float, dur_us: float) -> None:
        self.correlation += 1
        self.x("cudaLaunchKernel", "cuda_runtime", ts, 4, 1, correlation=self.correlation)
        self.x(kernel, "kernel", ts + 6, dur_us, 7, correlation=self.correlation, stream=7)

    def comm(self, ts: float, kernel: str, args: dict[str, Any] | None, note: str = "") -> None:
        """A c10d op: record_param_comms (with `args`, or none: older traces) around the
        launch, inside an `nccl:<op>` annotation when `note` names one."""
        if note:
            self.x(
                f"nccl:{note}",
                "user_annotation",
                ts - 2,
                20,
                1,
                **(args or {}).pop("_annotation", {}),
            )
        self.x("record_param_comms", "cpu_op", ts, 12, 1, **(args or {}))
        self.launch(kernel, ts + 3, 30)


def group_args(name: str, ranks: list[int], op: str, nelems: int, **extra: Any) -> dict[str, Any]:
    return {"Collective name": op, "dtype": "BFloat16", "In msg nelems": nelems,
            "Out msg nelems": nelems, "Group size": len(ranks), "Process Group Name": name,
            "Process Group Description": name, "Process Group Ranks": str(ranks),
            **extra}  # fmt: skip


def megatron_trace(
    rank: int, names: dict[str, str], with_args: bool = True, job: Job = JOB
) -> dict[str, Any]:
    """Two steps of a dp x pp x tp job (2 x 2 x 2 unless `job` says) on `rank`: four
    tensor-parallel all-reduces from the forward pass on (small, frequent), a stage's messages
    to its neighbours (the first stage sends and receives in one batch: `batch_isend_irecv`),
    the gradients' reduce-scatter at the end (large, once)."""
    trace = Trace(rank)
    mine = job.groups_of(rank)
    stage = job.coords(rank)[0]
    last = job.pp - 1
    following = mine["pp"][min(stage + 1, last)]
    previous = mine["pp"][max(stage - 1, 0)]
    for step in (1, 2):
        base = step * STEP_US
        trace.x(f"ProfilerStep#{step}", "user_annotation", base, STEP_US - 10, 1)
        for at in (20, 140, 420, 700):
            trace.launch("sm90_gemm_bf16", base + at + 40, 60)
            args = group_args(names["tp"], mine["tp"], "allreduce", 4096) if with_args else None
            trace.comm(base + at, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)", args,
                       "" if with_args else "all_reduce")  # fmt: skip
        # the first stage trades with the next; the others receive from the previous and
        # send on (the last sends the gradients back)
        pp_args = {"send": {"Dst Rank": following if stage < last else previous},
                   "recv": {"Src Rank": following if stage == 0 else previous}}  # fmt: skip
        if stage == 0:  # batch_isend_irecv: both scopes close before ncclGroupEnd launches
            trace.x("nccl:coalesced", "user_annotation", base + 300, 40, 1)
            for i, op in enumerate(("send", "recv")):
                args = group_args(names["pp"], mine["pp"], op, 2048, **pp_args[op])
                if not with_args:  # older PyTorch: each op's annotation, closed before too
                    trace.x(f"nccl:{op}", "user_annotation", base + 301 + 8 * i, 7, 1)
                trace.x("record_param_comms", "cpu_op", base + 302 + 8 * i, 5, 1,
                        **(args if with_args else {}))  # fmt: skip
            trace.launch("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
                         base + 325, 40)  # fmt: skip
        else:
            for at, op in ((300, "recv"), (600, "send")):
                args = group_args(names["pp"], mine["pp"], op, 2048, **pp_args[op])
                trace.comm(base + at, f"ncclDevKernel_SendRecv(ncclDevComm*) {op}",
                           args if with_args else None, "" if with_args else op)  # fmt: skip
        args = group_args(names["dp"], mine["dp"], "_reduce_scatter_base", 1 << 22)
        kernel = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*)"
        trace.comm(base + 880, kernel, args if with_args else None,
                   "" if with_args else "_reduce_scatter_base")  # fmt: skip
    info: dict[str, Any] = {"backend": "nccl", "rank": rank, "world_size": job.world}
    if with_args:
        info["pg_config"] = [
            {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
             "pg_size": job.world, "ranks": list(range(job.world))},
            *({"pg_name": str(i + 1), "pg_desc": names[axis], "backend_config": "cuda:nccl",
               "pg_size": len(mine[axis]), "ranks": mine[axis]}
              for i, axis in enumerate(("tp", "dp", "pp"))),
        ]  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": trace.events}


def args_on_kernels(trace: dict[str, Any]) -> dict[str, Any]:
    """Newer Kineto's shape: a collective's metadata copied onto its kernel (the launch's
    record_param_comms is what Kineto copies; a batch's ops stay on the CPU only)."""
    events = trace["traceEvents"]
    scopes = [e for e in events if e["name"] == "record_param_comms"]
    by_correlation = {}
    for launch in (e for e in events if e["cat"] == "cuda_runtime"):
        around = [s for s in scopes if s["ts"] <= launch["ts"] <= s["ts"] + s["dur"]]
        if around:
            by_correlation[launch["args"]["correlation"]] = around[0]
    for kernel in (e for e in events if e["cat"] == "kernel"):
        scope = by_correlation.get(kernel["args"]["correlation"])
        if scope is not None:
            kernel["args"] |= scope["args"]
            events.remove(scope)
    return trace


def names_without_ranks(trace: dict[str, Any]) -> dict[str, Any]:
    """PyTorch before 2.4: a collective's group by name only (`Process Group Ranks` absent)."""
    for event in trace["traceEvents"]:
        event.get("args", {}).pop("Process Group Ranks", None)
    return trace


def write(folder: Path, ranks: list[int], shape: Any = None, **options: Any) -> Path:
    folder.mkdir(parents=True)
    for rank in ranks:
        trace = megatron_trace(rank, **options)
        text = json.dumps(shape(trace) if shape else trace)
        (folder / f"rank{rank}.pt.trace.json").write_text(text)
    return folder


def expected_groups() -> dict[str, list[tuple[int, ...]]]:
    return JOB.expected_groups()


@pytest.mark.parametrize(
    ("names", "shape"),
    [(MEGATRON, None), (MESH, None), (SWAPPED, None), (MEGATRON, args_on_kernels),
     (MESH, names_without_ranks)],
    ids=["megatron", "mesh", "swapped", "args-on-kernels", "names-without-ranks"],
)  # fmt: skip
def test_the_layout_comes_from_what_each_group_carries(
    tmp_path: Path, names: dict, shape: Any
) -> None:
    folder = write(tmp_path / "t", list(range(WORLD)), shape=shape, names=names)
    run = load_trace_dir(folder, use_cache=False)
    manifest = run.manifest
    layout = manifest.layout
    assert (layout.dp, layout.pp, layout.tp, layout.ep) == (DP, PP, TP, 1)
    assert manifest.layout_source.startswith("from the traces' process groups")
    for axis, groups in expected_groups().items():  # by what they carry, whatever their names
        assert sorted(tuple(g) for g in manifest.groups[axis]) == groups, axis
    comms = run.comms
    by_op = comms.groupby("op")["group"].agg(set).to_dict()
    assert by_op == {"all_reduce": {"tp"}, "reduce_scatter": {"dp"}, "send": {"pp"},
                     "recv": {"pp"}}  # fmt: skip
    sends = comms[comms["op"] == "send"]
    assert all(sends["peer"] == [groups_of(r)["pp"][1 - coords(r)[0]] for r in sends["rank"]])
    assert set(comms.loc[comms["op"] == "reduce_scatter", "bytes"]) == {2 << 22}  # bf16


def test_one_rank_per_tensor_parallel_group_traced_gives_the_whole_world(tmp_path: Path) -> None:
    traced = [r for r in range(WORLD) if coords(r)[2] == 0]  # 0, 2, 4, 6
    run = load_trace_dir(write(tmp_path / "t", traced, names=MESH), use_cache=False)
    layout, groups = run.manifest.layout, run.manifest.groups
    assert (run.manifest.world_size, layout.dp, layout.pp, layout.tp) == (WORLD, DP, PP, TP)
    for axis, expected in expected_groups().items():
        assert sorted(tuple(g) for g in groups[axis]) == expected, axis
    assert any(f"traces of {len(traced)} of {WORLD} ranks" in note for note in run.skipped)


def test_a_batch_kernel_without_arguments_carries_the_ops_issued_before_it(tmp_path: Path) -> None:
    run = load_trace_dir(write(tmp_path / "t", [0, 4], names=MEGATRON), use_cache=False)
    first = run.comms[(run.comms["rank"] == 0) & run.comms["op"].isin(["send", "recv"])]
    assert sorted(first["op"]) == ["recv", "recv", "send", "send"]  # two steps, one kernel each
    per_kernel = first.groupby("t0")
    assert per_kernel.size().tolist() == [2, 2] and set(first["peer"]) == {4}
    # a receive is its rank's wait; a send in the batch only where it ended last and the rank
    # resumed at its end (diag/read/kineto/batches.py)
    assert first.loc[first["op"] == "recv", "blocking"].all()


def test_an_older_trace_reads_ops_from_annotations_and_says_the_layout_is_unknown(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "old"
    folder.mkdir()
    trace = Trace(0)
    trace.x("ProfilerStep#1", "user_annotation", 1000, 990, 1)
    dims = {"_annotation": {"Input Dims": [[384, 8]], "Input type": ["c10::BFloat16"]}}
    trace.comm(1100, "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)", dims,
               "all_to_all")  # fmt: skip
    data = {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 16},
            "traceEvents": trace.events}  # fmt: skip
    (folder / "rank0.json").write_text(json.dumps(data))
    run = load_trace_dir(folder, use_cache=False)
    (row,) = run.comms.to_dict("records")
    assert row["op"] == "all_to_all" and row["bytes"] == 384 * 8 * 2  # not `send`
    source = run.manifest.layout_source
    # one rank of 16 and an all-to-all: experts or context, of no size the trace gives
    assert source.startswith("unknown: no process groups") and "all-to-alls" in source
    assert run.manifest.groups == {}  # no group claimed
    report = diag.analyze_path(folder)
    assert report["run"]["layout_source"] == source
    assert "layout unknown: no process groups" in headline(report)  # never silently


def test_an_older_megatron_job_reads_its_ops_and_says_what_it_cannot_size(
    tmp_path: Path,
) -> None:
    """No group arguments, no pg_config: the ops from the annotations (a batch's too), and the
    layout said to be unknown, naming what the placement shows and cannot size."""
    folder = write(tmp_path / "t", list(range(WORLD)), names=MEGATRON, with_args=False)
    run = load_trace_dir(folder, use_cache=False)
    counts = run.comms["op"].value_counts().to_dict()
    per_rank_step = {op: n // (WORLD * 2) for op, n in counts.items()}
    assert per_rank_step == {"all_reduce": 4, "send": 1, "recv": 1, "reduce_scatter": 1}
    source = run.manifest.layout_source
    assert source.startswith("unknown: no process groups")
    for shown in (
        "tensor-parallel collectives inside the forward and backward passes",
        "data-parallel gradient reduction",
        "a pipeline's sends and receives",
    ):
        assert shown in source  # fmt: skip
    assert run.manifest.layout.pp == 1 and run.manifest.groups == {}


def test_given_layout_overrides_and_says_so(tmp_path: Path) -> None:
    folder = write(tmp_path / "t", list(range(WORLD)), names=MEGATRON)
    given = Layout(dp=WORLD)
    run = load_trace_dir(folder, layout=given, use_cache=False)
    assert run.manifest.layout.dp == WORLD and run.manifest.layout_source == "given"


def test_hostile_groups_are_skipped(tmp_path: Path) -> None:
    configs = [{"ranks": [0, 10**12]}, {"ranks": "x"}, 7, {"ranks": [1, 0], "pg_desc": "a"},
               {"ranks": [], "pg_size": 4}]  # fmt: skip
    assert pg_groups(configs, 4) == [((0, 1), ("a", "")), ((0, 1, 2, 3), ("", ""))]
    assert pg_groups({"k": {"ranks": [2, 3], "pg_name": "5"}}, 4) == [((2, 3), ("", "pg5"))]
    assert pg_groups("nonsense", 4) == []
    # PyTorch cuts a long list short; start and stride rebuild it when the shown ranks agree
    assert group_ranks("[0, 8, 16, ..., 504]", 0, 8, 64) == tuple(range(0, 512, 8))
    assert group_ranks("[0, 8, 17, ..., 504]", 0, 8, 64) is None
    assert group_ranks("[0, 8, ...]", 0, 8, 10**9) is None


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/real-traces is absent")
def test_real_traces_layout_and_ops() -> None:
    world2 = load_trace_dir(REAL / "hta-nccl-world2", use_cache=False)
    assert world2.manifest.layout.dp == 2
    assert world2.manifest.layout_source.startswith("from the traces' process groups")
    assert set(world2.comms["op"]) == {"all_reduce", "broadcast"}
    sampled = load_trace_dir(REAL / "hta-sampled-world128", use_cache=False)
    ops = sampled.comms.groupby("op")["bytes"].median().to_dict()
    # NCCL runs the all-to-all as SendRecv; the `nccl:all_to_all` annotation names it
    assert set(ops) == {"all_to_all", "all_reduce", "all_gather"}
    assert ops["all_reduce"] > 0 and ops["all_to_all"] > 0
    assert sampled.manifest.layout_source.startswith("unknown: no process groups")
    # a single rank's file of two early all-reduces (world 300) on gloo's worker thread, the
    # training thread computing meanwhile: asynchronous gradient reduction (DDP's), no
    # tensor parallelism, over the world (its only group)
    gloo = load_trace_dir(REAL / "hta-cpu-only-gloo", use_cache=False)
    assert set(gloo.comms["blocking"]) == {False}
    assert gloo.manifest.layout.tp == 1 and gloo.manifest.layout.dp == 300
    # DDP: a broadcast of its buffers at the step's start, then the gradients' buckets
    assert "dp spans every rank); ZeRO-0 read: " in world2.manifest.layout_source
    alltoall = load_trace_dir(REAL / "hta-alltoall-world16", use_cache=False)
    counts = alltoall.comms["op"].value_counts().to_dict()
    # its GPU runs 150 ms behind the CPU: the first 155 ms of stream 7's kernels, 5 SendRecv
    # among them, were launched before the trace began, and are no step's (they were read
    # by their start into step 550, as sends: their op from the kernel's name)
    assert counts.get("all_to_all", 0) == 45 and counts.get("send", 0) == 0
    assert not any("launch is not in the trace" in note for note in alltoall.skipped)


def test_a_dp4_pp4_tp4_job_with_one_trace_per_tensor_parallel_group(tmp_path: Path) -> None:
    """The issue's job: 64 ranks, 16 files (tp rank 0 of each group), read dp=64 before."""
    job = Job(dp=4, pp=4, tp=4)
    folder = tmp_path / "t"
    folder.mkdir()
    traced = [r for r in range(job.world) if job.coords(r)[2] == 0]
    for rank in traced:
        text = json.dumps(megatron_trace(rank, MEGATRON, job=job))
        (folder / f"rank{rank}.pt.trace.json").write_text(text)
    run = load_trace_dir(folder, use_cache=False)
    layout = run.manifest.layout
    assert (run.manifest.world_size, layout.dp, layout.pp, layout.tp) == (64, 4, 4, 4)
    for axis, expected in job.expected_groups().items():
        assert sorted(tuple(g) for g in run.manifest.groups[axis]) == expected, axis


def test_a_collective_one_rank_lacks_shifts_no_match_and_messages_are_not_matched_by_count() -> (
    None
):
    """A trace that begins after a rank launched its first all-reduce holds one kernel more on
    that rank (read by name); counted per step, only that step's matches can shift. Sends are
    paired by peer elsewhere, never as every rank's n-th send (a job read "rank 48 starts
    collectives last, 457,398.9 ms behind" so)."""
    rows = []
    for rank in (0, 1):
        for step in (1, 2, 3):
            base = step * 1_000_000
            rows += [{"rank": rank, "step": step, "op": "all_reduce", "group": None,
                      "t0": base + at} for at in (100_000, 500_000)]  # fmt: skip
            # sends of different stages, far apart: no lateness of theirs may be read
            rows.append({"rank": rank, "step": step, "op": "send", "group": None,
                         "t0": base + 900_000 * rank})  # fmt: skip
    rows.append({"rank": 0, "step": 1, "op": "all_reduce", "group": None, "t0": 1_000_001})
    comms = pd.DataFrame(rows)
    steps = pd.DataFrame([{"rank": r, "step": s} for r in (0, 1) for s in (1, 2, 3)])
    table = arrivals(comms, steps, Manifest(run_id="x", created="", world_size=2))
    assert table["late_median_s"].tolist() == [0.0, 0.0]


def _messages(world: int, inner: int, ring: bool) -> tuple[list[dict], list[dict]]:
    """Two steps of a dp x `inner` job (inner groups of consecutive ranks) as comm records:
    six rounds of messages in each inner group, round a ring (`ring`: each rank sends to the
    next, receives from the previous, the last sending to the first: ring attention's key and
    value blocks) or along a pipeline (activations forward, gradients back, the ends trading
    with one neighbour); and the gradients' all-reduce over the data-parallel group."""
    comms: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    dp = world // inner
    for rank in range(world):
        base, i = rank - rank % inner, rank % inner
        group = tuple(range(base, base + inner))
        replicas = tuple(rank % inner + k * inner for k in range(dp))
        for step in (1, 2):
            t0 = step * 10_000
            steps.append({"rank": rank, "step": step, "t0": t0, "t1": t0 + 9_000})
            for n in range(6):
                if ring:
                    pairs = [("send", base + (i + 1) % inner), ("recv", base + (i - 1) % inner)]
                elif n < 3:  # forward: from the previous stage, on to the next
                    pairs = [("recv", rank - 1)] * (i > 0) + [("send", rank + 1)] * (i < inner - 1)
                else:  # backward: the gradients the other way
                    pairs = [("recv", rank + 1)] * (i < inner - 1) + [("send", rank - 1)] * (i > 0)
                for op, peer in pairs:
                    comms.append({"rank": rank, "step": step, "op": op, "t0": t0 + 500 + n * 900,
                                  "group_ranks": group, "group": "pg1", "peer": peer})  # fmt: skip
            comms.append({"rank": rank, "step": step, "op": "all_reduce", "t0": t0 + 8_000,
                          "group_ranks": replicas, "group": "pg2", "peer": None})  # fmt: skip
    return comms, steps


def test_messages_round_a_ring_are_context_parallel_a_chain_is_a_pipeline() -> None:
    comms, steps = _messages(8, 4, ring=True)
    found = infer_layout(8, [], comms, steps)
    layout = found.layout
    assert (layout.dp, layout.cp, layout.pp, layout.tp) == (2, 4, 1, 1), found.source
    assert found.groups["cp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert "ring is context parallel" in found.source
    comms, steps = _messages(8, 4, ring=False)
    layout = infer_layout(8, [], comms, steps).layout
    assert (layout.dp, layout.cp, layout.pp) == (2, 1, 4)


def test_only_gradient_reduction_is_data_parallel_over_the_world(tmp_path: Path) -> None:
    """An older trace (no groups) whose ranks all reduce gradient-sized buckets after the
    forward pass and nothing else: every rank data parallel, said to be inferred."""
    comms, steps = _messages(4, 1, ring=True)
    comms = [c | {"group_ranks": None, "bytes": 1 << 24} for c in comms if c["op"] == "all_reduce"]
    found = infer_layout(4, [], comms, steps)
    assert found.layout.dp == 4 and found.groups["dp"] == [[0, 1, 2, 3]]
    assert found.source.startswith("inferred: no process groups") and "dp spans" in found.source
    nothing = infer_layout(4, [], [], steps)
    assert nothing.source.startswith("unknown:") and nothing.groups == {}


def test_a_window_left_open_has_no_status_the_traces_cannot_give(tmp_path: Path) -> None:
    """Every traced rank's window closed at the same step: complete. One rank's trace stops
    a step before the others' (it hung, died or was cut short: the traces cannot say which):
    the status is left undecided, never 'completed'."""
    folder = write(tmp_path / "t", list(range(WORLD)), names=MESH)
    assert load_trace_dir(folder, use_cache=False).manifest.status == "complete"
    trace = megatron_trace(3, MESH)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["ts"] < 2 * STEP_US]
    (folder / "rank3.pt.trace.json").write_text(json.dumps(trace))
    run = load_trace_dir(folder, use_cache=False)
    assert run.manifest.status == "unknown"
    report = diag.analyze_path(folder)
    assert report["summary"]["status"] == "undecidable"
    # the rank whose trace stops early is named, in the reason and the finding
    assert report["summary"]["status_reason"].startswith("rank 3 stops before the others")
    assert (report["findings"][0]["rule"], report["findings"][0]["ranks"]) == ("FLR005", [3])
