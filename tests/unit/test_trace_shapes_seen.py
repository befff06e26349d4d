"""Shapes of real GPU traces that nobody here wrote (public repositories' test traces, read by
a helper session), each of which diag misread:
- TraceLens' exports open with a 26 KB `"metadata"` block: the file was not taken for a
  trace (its keys were looked for in the first 4 KB only);
- a GPU running behind its CPU runs, at the profiler window's start, kernels launched before
  it (their launch is not in the trace): read by their own start, they swelled a ROCm job's
  first steps from 19 to 35 ms;
- Kineto before PyTorch 1.9 names its categories `Kernel`, `Operator`, `Runtime`: its kernels
  were no rank's busy time and its steps (`Operator`s) were lost;
- a world of one rank has no layout to be unknown;
- MTIA's device work (`mtia_ccp_events`) was no device work: the trace read as a CPU-only one.
The events are built here in the shapes those traces have (test_kineto.py's helpers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.api import analyze_path
from diag.metrics import compute_metrics
from diag.read.kineto import is_trace_dir, load_trace_dir
from tests.unit.test_kineto import _step_events, _trace, _write, _x


def test_a_trace_opening_with_a_long_block_is_a_trace(tmp_path: Path) -> None:
    data = {"metadata": {"notes": "x" * 26_000}, **_trace(0, world=1, events=_step_events())}
    _write(tmp_path / "gz", "export.json.gz", data, compress=True)
    _write(tmp_path / "plain", "export.json", data)
    for folder in (tmp_path / "gz", tmp_path / "plain"):
        assert is_trace_dir(folder)
        assert len(load_trace_dir(folder, use_cache=False).steps) == 1
    # past the bound read (4 MiB), or no key at all: not a trace
    far = {"metadata": "x" * (5 * 2**20), **_trace(0, world=1, events=_step_events())}
    _write(tmp_path / "far", "export.json", far)
    _write(tmp_path / "none", "export.json", {"metadata": "traceEvent" * 20_000})
    assert not is_trace_dir(tmp_path / "far") and not is_trace_dir(tmp_path / "none")
    # a file that is no JSON object is read no further than its first chunk
    (tmp_path / "array").mkdir()
    (tmp_path / "array" / "data.json").write_text(json.dumps(["x" * 70_000, {"traceEvents": []}]))
    assert not is_trace_dir(tmp_path / "array")


def _two_steps(launch_at_us: float, runs_after_us: float) -> list[dict]:
    """Steps 1 and 2 (CPU 0-100 and 100-200 us), each launching, `launch_at_us` into it, a
    30 us kernel on stream 7 that runs `runs_after_us` after its launch."""
    events = [_x("ProfilerStep#1", "user_annotation", 0, 100),
              _x("ProfilerStep#2", "user_annotation", 100, 100)]  # fmt: skip
    for step, at in ((1, launch_at_us), (2, 100 + launch_at_us)):
        events += [
            _x("cudaLaunchKernel", "cuda_runtime", at, 2, correlation=step),
            _x("gemm", "kernel", at + runs_after_us, 30, correlation=step, stream=7),
        ]
    return events


def _behind(launched_before: int) -> list[dict]:
    """Steps 1 and 2 (CPU 0-100 and 100-200 us), each launching a 30 us kernel on stream 7 that
    runs 50 us later; before them, `launched_before` kernels launched before the window (no
    launch in the trace) run 0-40 us; and a kernel of no launch after step 1's, on its stream."""
    events = _two_steps(launch_at_us=10, runs_after_us=50)
    width = 40 / max(launched_before, 1)
    events += [
        _x("old_gemm", "kernel", i * width, width, correlation=900 + i, stream=7)
        for i in range(launched_before)
    ]  # fmt: skip
    events.append(_x("unlaunched", "kernel", 95, 5, correlation=999, stream=7))
    return events


def test_kernels_launched_before_the_window_are_in_no_step(tmp_path: Path) -> None:
    _write(tmp_path, "rank0.json", _trace(0, world=1, events=_behind(launched_before=5)))
    steps = load_trace_dir(tmp_path, use_cache=False).steps
    windows = {int(s.step): (int(s.t0), int(s.t1)) for s in steps.itertuples()}
    # step 1: its gemm (60-90 us) and the unlaunched kernel after it on its stream (95-100);
    # step 2 from there (the device idled until its gemm: `test_a_late_launch_...`)
    assert windows == {1: (60_000, 100_000), 2: (100_000, 190_000)}


def test_a_late_launch_is_its_steps_time(tmp_path: Path) -> None:
    """A loader that holds each CPU step 40 us before its launch: the device idles between
    its steps' kernels; that idle time is the later step's (as a real trace's CPU iterations
    measure it: hta-nccl-world2 reads 222.4 ms steps, its ProfilerSteps' 222.3, not 216.1),
    so the step is the iteration (100 us) and its idle share is the wait."""
    events = _two_steps(launch_at_us=40, runs_after_us=10)
    _write(tmp_path, "rank0.json", _trace(0, world=1, events=events))
    run = load_trace_dir(tmp_path, use_cache=False)
    windows = {int(s.step): (int(s.t0), int(s.t1)) for s in run.steps.itertuples()}
    assert windows == {1: (50_000, 80_000), 2: (80_000, 180_000)}
    second = compute_metrics(run).rank_steps.set_index("step").loc[2]
    assert (second["wall_s"], second["busy_s"]) == pytest.approx((100e-6, 30e-6))


def _side_stream_ahead(steps: int) -> list[dict]:
    """A GPU running 150 us behind its CPU (100 us steps): each CPU step launches at once a
    5 us copy on stream 25, which runs 1 us later, and a 40 us GEMM on stream 7, which runs
    when the main stream gets to it (hta-alltoall-world16's shape: its side streams run the
    next step's copies while stream 7 is still on this one)."""
    events = []
    for k in range(steps):
        cpu = 100 * k
        events += [
            _x(f"ProfilerStep#{k + 1}", "user_annotation", cpu, 100),
            _x("cudaMemcpyAsync", "cuda_runtime", cpu + 2, 1, correlation=2 * k + 1),
            _x("Memcpy HtoD", "gpu_memcpy", cpu + 3, 5, correlation=2 * k + 1, stream=25),
            _x("cudaLaunchKernel", "cuda_runtime", cpu + 10, 2, correlation=2 * k + 2),
            _x("gemm", "kernel", cpu + 150, 40, correlation=2 * k + 2, stream=7),
        ]
    return events


def test_overlapping_step_windows_read_as_the_iteration(tmp_path: Path) -> None:
    """Each step's kernels span 187 us (its copy at once, its GEMM 150 us later) for 100 us
    iterations; on the device a step runs from the previous step's end to its own, and its
    busy time is what ran in that window: its GEMM and the copy launched early for a later
    step (hta-alltoall-world16 read 374 ms steps for its 216 ms iterations)."""
    _write(tmp_path, "rank0.json", _trace(0, world=1, events=_side_stream_ahead(steps=4)))
    run = load_trace_dir(tmp_path, use_cache=False)
    windows = {int(s.step): (int(s.t0), int(s.t1)) for s in run.steps.itertuples()}
    assert windows == {1: (3_000, 190_000), 2: (190_000, 290_000), 3: (290_000, 390_000),
                       4: (390_000, 490_000)}  # fmt: skip
    measured = compute_metrics(run).rank_steps.set_index("step")
    assert measured.loc[[2, 3, 4], "wall_s"].tolist() == pytest.approx([100e-6] * 3)
    # steps 2 and 3: their GEMMs and the next step's copy (203-208 and 303-308 us); step 4:
    # its GEMM (step 5's copy would run in its window)
    assert measured.loc[[2, 3, 4], "busy_s"].tolist() == pytest.approx([45e-6, 45e-6, 40e-6])


def test_a_collective_before_its_window_is_not_in_the_forward_pass() -> None:
    """A collective launched early that ran while the previous step's work still ran needed
    none of its step's: not inside its forward pass (the placement of the layout)."""
    from diag.read.kineto.placement import starts_early

    assert starts_early(110, 100, 200) and not starts_early(130, 100, 200)
    assert not starts_early(90, 100, 200) and not starts_early(100, 100, 100)


def test_a_trace_without_launches_keeps_its_kernels_steps_by_time(tmp_path: Path) -> None:
    events = [e for e in _behind(launched_before=0) if e["cat"] != "cuda_runtime"]
    _write(tmp_path, "rank0.json", _trace(0, world=1, events=events))
    steps = load_trace_dir(tmp_path, use_cache=False).steps
    assert sorted(steps["step"]) == [1, 2]


LEGACY = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "cuda_runtime": "Runtime",
          "cpu_op": "Operator", "user_annotation": "Operator"}  # fmt: skip


def test_kineto_of_2021_reads_as_today(tmp_path: Path) -> None:
    """The same step in today's categories and in 2021's gives the same records."""
    today, legacy = tmp_path / "today", tmp_path / "legacy"
    events = _step_events()
    old = [{**e, "cat": LEGACY.get(e["cat"], e["cat"])} for e in events]
    _write(today, "worker0.pt.trace.json", _trace(0, world=1, events=events))
    _write(legacy, "worker0.pt.trace.json", {"schemaVersion": 1, "traceEvents": old})
    read = [compute_metrics(load_trace_dir(f, use_cache=False)).rank_steps for f in (today, legacy)]
    columns = ["step", "wall_s", "busy_s", "exposed_comm_s", "idle_s"]
    assert read[1][columns].values.ravel() == pytest.approx(read[0][columns].values.ravel())
    assert read[1]["busy_s"].iloc[0] > 0


def test_mtias_device_work_reads_as_a_gpus(tmp_path: Path) -> None:
    """HTA's MTIA traces: the device's work is `mtia_ccp_events`, its launches `mtia_runtime`,
    tied by correlation. Unread, the trace was a CPU-only one, its operators busy 100% of the
    step beside a device table that said the device idled 45%."""
    events = _two_steps(launch_at_us=10, runs_after_us=95)  # each runs in the next CPU step
    _write(tmp_path / "cuda", "rank0.json", _trace(0, world=1, events=events))
    cuda = compute_metrics(load_trace_dir(tmp_path / "cuda", use_cache=False)).rank_steps
    columns = ["step", "wall_s", "busy_s", "idle_s"]
    spellings = {
        "mtia": {"kernel": "mtia_ccp_events", "cuda_runtime": "mtia_runtime"},
        "xpu": {"cuda_runtime": "xpu_runtime"},  # Intel GPUs: their launches tie each kernel
        # to the CPU step that launched it (unread, each was the next step's by its start)
    }
    for device, spelled in spellings.items():
        renamed = [{**e, "cat": spelled.get(e["cat"], e["cat"])} for e in events]
        _write(tmp_path / device, "rank0.json", _trace(0, world=1, events=renamed))
        run = load_trace_dir(tmp_path / device, use_cache=False)
        read = compute_metrics(run).rank_steps
        assert read[columns].values.ravel() == pytest.approx(cuda[columns].values.ravel())
        assert read["busy_s"].tolist() == pytest.approx([30e-6] * 2)  # the kernels
        assert run.manifest.device_type == device  # its findings name it, not a GPU
    assert load_trace_dir(tmp_path / "cuda", use_cache=False).manifest.device_type == "cuda"


def test_findings_name_the_device_and_its_remedies() -> None:
    """A host-starved MTIA read "GPU starved by its host ... CUDA graphs ...
    torch.cuda.synchronize()": the device's name and the remedies said for it."""
    from diag.rules.device_words import device_word, for_device

    advice = "fewer syncs: no .item() of GPU tensors or torch.cuda.synchronize(); CUDA graphs"
    assert (device_word("mtia"), device_word("cuda"), device_word(None)) == ("MTIA", "GPU", "GPU")
    assert for_device(advice, "cuda") == advice
    said = for_device(advice, "mtia")
    assert "cuda" not in said.lower() and "GPU" not in said and "graph capture" in said


def test_a_gpu_job_profiled_without_its_device_says_so(tmp_path: Path) -> None:
    """`activities=[ProfilerActivity.CPU]` on a GPU job: launches, no kernels. Read as a CPU
    job's, its busy time was the host's operators and its NCCL collectives nothing, with no
    word; a CPU job's trace (no launches) has nothing to say."""
    events = [e for e in _two_steps(launch_at_us=10, runs_after_us=20) if e["cat"] != "kernel"]
    _write(tmp_path / "gpu", "rank0.json", _trace(0, world=1, events=events))
    notes = analyze_path(tmp_path / "gpu")["skipped"]
    assert any("call the device's runtime (2 kernel launches" in n and
               "ProfilerActivity.CUDA" in n for n in notes), notes  # fmt: skip
    cpu = [e for e in events if e["cat"] != "cuda_runtime"]
    _write(tmp_path / "cpu", "rank0.json", _trace(0, world=1, events=cpu))
    assert not any("runtime" in n for n in analyze_path(tmp_path / "cpu")["skipped"])


def test_a_cupti_range_profilers_trace_says_its_counters_are_no_timeline(tmp_path: Path) -> None:
    """HTA's `cupti_profiler` trace: the CUPTI range profiler replays each kernel alone to
    count its instructions, and writes one `cuda_profiler_range` event a kernel, its counters
    as arguments and no stream. It read 11.8 s steps 100% idle, with a note blaming a profile
    without ProfilerActivity.CUDA; those events are now left out, said as what they are."""
    events = [e for e in _two_steps(launch_at_us=10, runs_after_us=20) if e["cat"] != "kernel"]
    counters = {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 38731776}
    ranges = [{"ph": "X", "cat": "cuda_profiler_range", "name": "volta_sgemm_128x64_nn",
               "pid": 0, "tid": 0, "ts": 5 + 40 * i, "dur": 121431, "args": counters}
              for i in range(2)]  # fmt: skip
    _write(tmp_path, "rank0.json", _trace(0, world=1, events=events + ranges))
    notes = analyze_path(tmp_path)["skipped"]
    assert any("2 events skipped (CUPTI range profiler counters" in n for n in notes), notes
    assert any("hold the CUPTI range profiler's counters of 2 kernels" in n for n in notes)
    assert not any("ProfilerActivity.CUDA" in n for n in notes), notes


def test_an_all_to_all_kernel_no_cpu_op_describes_shows_all_to_alls() -> None:
    """DeepSeek-V3's trace: DeepEP's dispatch and combine kernels, no CPU op naming them. A
    kernel named an all-to-all is one (MoE tokens): the layout unknown, its headline said
    "no communication in them tells the layout". An NCCL SendRecv kernel's name says no
    more than a message (a pipeline's, or part of an all-to-all): still no evidence."""
    from diag.read.kineto.placement import kinds_shown

    steps = [{"rank": 0, "step": 1, "t0": 0, "t1": 100}]
    dispatch = {"rank": 0, "step": 1, "op": "all_to_all", "from_name": True, "t0": 10}
    sendrecv = {**dispatch, "op": "send"}
    assert kinds_shown([dispatch], steps) == {"a2a"}
    assert kinds_shown([sendrecv], steps) == set()


def test_a_world_of_one_rank_has_its_layout(tmp_path: Path) -> None:
    _write(tmp_path, "rank0.json", _trace(0, world=1, events=_step_events()))
    run = analyze_path(tmp_path)["run"]
    assert run["layout"]["dp"] == 1 and run["layout_source"].startswith("of one rank")


def test_all_reduces_outside_nccl_are_communication() -> None:
    """vLLM's TP all-reduce on B200 runs PyTorch's symmetric-memory kernel (73 a step, 19% of
    the kernel time): computation, before; and its op is an all-reduce, not a `reduce`."""
    from diag.read.kineto.kernels import KernelClass, KernelPatterns, op_from_kernel_name

    names = [
        "(anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>",
        "c10d::symmetric_memory::two_shot_all_reduce_kernel<float, 8>",
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)",
        "void tensorrt_llm::kernels::oneShotAllReduceKernel<half, 8>(...)",
    ]
    kinds = KernelPatterns().classify(names, ["kernel"] * len(names))
    assert set(kinds) == {KernelClass.COMM.value}
    assert {op_from_kernel_name(n) for n in names} == {"all_reduce"}
    assert KernelPatterns().classify(["void at::native::reduce_kernel<512, 1>"], ["kernel"])[0] == (
        KernelClass.COMPUTE.value
    )


def test_transformer_engines_userbuffers_are_communication() -> None:
    """Megatron's TP communication overlap runs Transformer Engine's userbuffers kernels beside
    its GEMMs: all-gathers, reduce-scatters and the ring's pushes and pulls; computation,
    before, so a TP job's overlapped communication was no communication at all."""
    from diag.read.kineto.kernels import KernelClass, KernelPatterns, op_from_kernel_name

    ops = {
        "void userbuffers_fp16_sum_inplace_gpu_rw_ag<2>(int, int, void**, int)": "all_gather",
        "void userbuffers_fp16_sum_inplace_gpu_mc_ag<4>(int)": "all_gather",
        "void userbuffers_fp16_sum_inplace_gpu_rr_rs<2>(int, int, void**)": "reduce_scatter",
        "userbuffers_fp16_sum_inplace_gpu_rr_rs_oop_fp8<8>(int)": "reduce_scatter",
        "kuserbuffers_pushsendrecv(int*, int*, int4*, int4*, int, int, int)": "send",
        "kuserbuffers_pullrecv(int, int)": "recv",
    }
    kinds = KernelPatterns().classify(list(ops), ["kernel"] * len(ops))
    assert set(kinds) == {KernelClass.COMM.value}
    assert {name: op_from_kernel_name(name) for name in ops} == ops


def _by_stream_loop(steps: list[int], launched: list[bool], t0: list[int], streams: list[int]):
    """The rule read plainly, a stream at a time (what the one-sort version must equal)."""
    out = list(steps)
    for stream in set(streams):
        mine = sorted((i for i, s in enumerate(streams) if s == stream), key=lambda i: t0[i])
        if not any(launched[i] for i in mine):
            continue
        last = -1
        for i in mine:
            if launched[i]:
                last = steps[i]
            else:
                out[i] = last
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.booleans(), st.integers(0, 50), st.integers(0, 3)),
        min_size=1,
        max_size=40,
    )
)
def test_unlaunched_kernels_take_their_streams_order(kernels: list[tuple]) -> None:
    import numpy as np

    from diag.read.kineto.convert import _unlaunched_by_stream_order

    steps, launched, t0, streams = (list(column) for column in zip(*kernels, strict=True))
    t0 = [start * 100 + i for i, start in enumerate(t0)]  # distinct starts: one order
    found = _unlaunched_by_stream_order(
        np.array(steps), np.array(launched), np.array(t0), np.array(streams)
    )
    expected = steps if all(launched) or not any(launched) else (
        _by_stream_loop(steps, launched, t0, streams)
    )  # fmt: skip
    assert found.tolist() == expected
