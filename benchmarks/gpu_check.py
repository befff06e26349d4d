"""Every CUDA path of the collectors and the analysis, checked in one short call on a GPU machine.

    python3 benchmarks/gpu_check.py OUT             # a machine with one GPU: under 8 minutes
    python3 benchmarks/gpu_check.py OUT --dry-run   # here, on CPU: the same steps, CUDA's skipped

Writes OUT/summary.txt (one line per step: PASS, FAIL, SKIP or INFO, its seconds and what it
showed), OUT/summary.json (every figure), and the evidence: OUT/env.json, the jobs' run
directories and profiler traces (OUT/runs/), their logs (OUT/logs/) and diag's reports of each
run directory and trace folder (OUT/reports/). docs/collectors.md ("Checking the CUDA paths on
a GPU") says how to run it on the device machine and what each line means.

The steps: the environment; whether NCCL lets two ranks share the one GPU (it refuses: the
shared-GPU jobs then run on gloo with CUDA tensors, $DIAG_BACKEND=gloo); the allocator's
figures, CUDA-event timing and pynvml in this process against torch's own; the DP trainer and
examples/own_loop.py on NCCL with one rank and on gloo with two ranks sharing the GPU, with
the collectors on and the DP trainer profiled (torch.profiler with CUDA activities); for each
job the collectors' CUDA fields against wall time and the allocator; `diag analyze` of each run
directory and trace folder with HTA's figures beside diag's; an injected straggler and an
injected memory leak on the GPU, diagnosed from both sources. Every step is guarded: one that
fails is recorded with its error and the others go on. With --dry-run the jobs run on CPU
(gloo) and the steps that need CUDA are skipped with their reason.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import io
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOB_TIMEOUT_S = 180
"""One job (torchrun) at most; a hung NCCL init must not eat the whole budget."""
PROBE_TIMEOUT_S = 90
PACKAGES = ("torch", "pandas", "pyarrow", "numba", "click", "msgspec", "pynvml", "hta", "plotly")
"""What diag needs on the device machine (`hta` and `plotly` for HTA's figures, `msgspec` for
fast trace reading: carried as wheels where the image lacks them)."""


@dataclass
class Outcome:
    name: str
    status: str  # PASS, FAIL, SKIP, INFO
    seconds: float
    line: str  # what it showed, one line
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Check:
    out: Path
    dry_run: bool
    cuda: bool
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    runs: dict[str, Path] = field(default_factory=dict)  # job -> its run directory

    def step(self, name: str, needs_cuda: bool, fn: Callable[[], tuple[str, str, dict]]) -> None:
        """Run one step, guarded: (status, line, figures), or FAIL with the error."""
        t0 = time.monotonic()
        if needs_cuda and not self.cuda:
            why = "dry run" if self.dry_run else "no CUDA device"
            self._add(Outcome(name, "SKIP", 0.0, f"needs CUDA ({why})"))
            return
        if t0 - self.started > self.budget_s:
            self._add(Outcome(name, "SKIP", 0.0, f"the {self.budget_s:.0f} s budget is spent"))
            return
        try:
            status, line, figures = fn()
        except Exception as err:  # every step guarded: record it and go on
            (self.out / "logs").mkdir(parents=True, exist_ok=True)
            (self.out / "logs" / f"{name}.error.txt").write_text(traceback.format_exc())
            status, line, figures = "FAIL", f"{type(err).__name__}: {err}"[:300], {}
        self._add(Outcome(name, status, time.monotonic() - t0, " ".join(line.split()), figures))

    def _add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        print(_summary_line(outcome), flush=True)


def _summary_line(o: Outcome) -> str:
    return f"{o.status:<4}  {o.name:<28} {o.seconds:6.1f} s  {o.line}"


# --- the environment and the in-process checks ---------------------------------------------


def environment(check: Check) -> tuple[str, str, dict]:
    import torch

    env: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda, "cpus": os.cpu_count(),
        "packages": {name: _version(name) for name in PACKAGES},
    }  # fmt: skip
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}",
                   device_memory_bytes=props.total_memory, gpus=torch.cuda.device_count(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))  # fmt: skip
        env["nvml"] = _nvml_readings()
    (check.out / "env.json").write_text(json.dumps(env, indent=1, default=str))
    missing = [n for n, v in env["packages"].items() if v is None]
    line = (f"torch {env['torch']} CUDA {env['torch_cuda']} NCCL {env.get('nccl')} "
            f"driver {env.get('nvml', {}).get('driver')} device {env.get('device', 'none')}"
            f"{'; missing: ' + ', '.join(missing) if missing else ''}")  # fmt: skip
    return ("PASS" if not missing else "INFO"), line, env


DISTRIBUTIONS = {"pynvml": "nvidia-ml-py", "hta": "traceinsight"}
"""The distribution of an import name, where they differ (for its version)."""


def _version(name: str) -> str | None:
    """The installed version of an importable module; None when it does not import."""
    try:
        importlib.import_module(name)
    except Exception:  # absent, or broken on import
        return None
    try:
        return importlib.metadata.version(DISTRIBUTIONS.get(name, name))
    except importlib.metadata.PackageNotFoundError:
        return "present"


def _nvml_readings() -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    memory = pynvml.nvmlDeviceGetMemoryInfo(h)
    driver = pynvml.nvmlSystemGetDriverVersion()
    return {
        "driver": driver.decode() if isinstance(driver, bytes) else driver,
        "util_pct": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "mem_used_bytes": memory.used, "mem_total_bytes": memory.total,
        "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    }  # fmt: skip


def allocator_and_events(check: Check) -> tuple[str, str, dict]:
    """The collectors' memory categories, CUDA-event timing and pynvml sample, in this process,
    against torch.cuda.memory_stats, wall time and pynvml read directly."""
    import torch

    from collectors.device import CudaSpanTimer, NvmlSampler
    from collectors.memory import memory_breakdown

    device = torch.device("cuda", 0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(256, 2048, device=device)).sum().backward()
    optimizer.step()
    torch.cuda.synchronize()
    params = list(model.parameters())
    ours = memory_breakdown(params, optimizer, None, {}, device)
    stats = torch.cuda.memory_stats(device)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    allocated, reserved = stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"]
    timer = CudaSpanTimer.create(device)
    assert timer is not None
    x = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    record: dict[str, Any] = {}
    wall0 = time.perf_counter()
    event = timer.start()
    for _ in range(20):
        x @ x
    timer.stop(record, event)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - wall0) * 1e3
    (done,) = timer.resolve(wait=True)
    sampler = NvmlSampler.create(device)
    sample = sampler.sample() if sampler is not None else {}
    figures = {
        "params_bytes": ours["params"], "params_expected": param_bytes,
        "fragmentation": ours["fragmentation"], "reserved_minus_allocated": reserved - allocated,
        "device_peak": ours["device_peak"], "allocated_peak": stats["allocated_bytes.all.peak"],
        "event_ms": done["device_ms"], "wall_ms": wall_ms, "nvml": sample,
    }  # fmt: skip
    ok = (
        ours["params"] == param_bytes
        and ours["fragmentation"] == reserved - allocated
        and ours["device_peak"] == stats["allocated_bytes.all.peak"]
        and 0.5 * wall_ms <= done["device_ms"] <= 1.05 * wall_ms
        and 0 <= sample.get("util_pct", -1) <= 100
    )
    line = (f"params {ours['params']} = {param_bytes} B; fragmentation {ours['fragmentation']} B "
            f"= reserved - allocated {reserved - allocated}; peak {ours['device_peak']} = "
            f"{stats['allocated_bytes.all.peak']}; CUDA events {done['device_ms']:.1f} ms vs "
            f"wall {wall_ms:.1f} ms; nvml util {sample.get('util_pct')}%")  # fmt: skip
    return ("PASS" if ok else "FAIL"), line, figures


NCCL_PROBE = """
import os, torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl")
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("RESULT", t.item())
dist.destroy_process_group()
"""


def nccl_two_ranks_one_gpu(check: Check) -> tuple[str, str, dict]:
    """Whether NCCL runs two ranks on one GPU (it refuses: 'Duplicate GPU detected')."""
    probe = check.out / "logs" / "nccl_probe.py"
    probe.write_text(NCCL_PROBE)
    code, log, _ = _torchrun(check, "nccl_probe", [str(probe)], 2, {}, PROBE_TIMEOUT_S)
    allowed = code == 0 and "RESULT 2.0" in log
    reason = next((ln.strip() for ln in log.splitlines() if "Duplicate GPU" in ln
                   or "ncclInvalidUsage" in ln), "")  # fmt: skip
    line = ("NCCL ran two ranks on one GPU" if allowed else
            f"NCCL refused two ranks on one GPU (exit {code}): {reason[:160]}; "
            "the shared-GPU jobs run on gloo with CUDA tensors")  # fmt: skip
    return "INFO", line, {"allowed": allowed, "exit": code, "reason": reason}


# --- the jobs --------------------------------------------------------------------------------

SMALL_GPT = ["--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "128",
             "--vocab", "512", "--micro-batch", "8"]  # fmt: skip
TINY_GPT = ["--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "16",
            "--vocab", "64", "--micro-batch", "2"]  # fmt: skip


@dataclass(frozen=True)
class Job:
    name: str
    module: str  # `-m` module, or a script path
    nproc: int
    args: tuple[str, ...]
    shared_gpu: bool = False  # ranks share the one GPU: gloo with CUDA tensors
    profiled: bool = False


def jobs(check: Check) -> list[Job]:
    model = SMALL_GPT if check.cuda else TINY_GPT
    steps = ["--steps", "12" if check.cuda else "6"]
    window = ["--profile-steps", "4:7" if check.cuda else "2:4"]
    own = ["--steps", "12" if check.cuda else "6"] + (["--device", "cuda"] if check.cuda else [])
    leak = "leak:mb=64" if check.cuda else "leak:mb=4"
    return [
        Job("dp_nccl_1", "reference_runs.dp", 1, (*model, *steps, *window), profiled=True),
        Job("own_loop_nccl_1", str(ROOT / "examples" / "own_loop.py"), 1, tuple(own)),
        Job("dp_shared_gpu_2", "reference_runs.dp", 2, (*model, *steps, *window),
            shared_gpu=True, profiled=True),
        Job("own_loop_shared_gpu_2", str(ROOT / "examples" / "own_loop.py"), 2,
            (*own, "--backend", "gloo"), shared_gpu=True),
        Job("dp_straggler_2", "reference_runs.dp", 2,
            (*model, *steps, *window, "--inject", "straggler:rank=1,ms=40"), shared_gpu=True,
            profiled=True),
        # activations (where the leak is held) are measured on steps 0-2 and every 10th: 22
        # steps give TRD002 the five points it needs
        Job("dp_leak_1", "reference_runs.dp", 1,
            (*model, "--steps", "22", *window, "--inject", leak), profiled=True),
    ]  # fmt: skip


def run_job(check: Check, job: Job) -> tuple[str, str, dict]:
    run_dir = check.out / "runs" / job.name
    env = {"DIAG_RANK_FORMAT": "jsonl"}  # the evidence readable as it was written
    if job.shared_gpu:
        env["DIAG_BACKEND"] = "gloo"
    args = ["-m", job.module] if not job.module.endswith(".py") else [job.module]
    code, log, seconds = _torchrun(check, job.name, [*args, "--out", str(run_dir), *job.args],
                                   job.nproc, env, JOB_TIMEOUT_S)  # fmt: skip
    if code != 0:
        tail = " | ".join(log.strip().splitlines()[-3:])
        return "FAIL", f"exit {code} after {seconds:.0f} s: {tail[-250:]}", {"exit": code}
    check.runs[job.name] = run_dir
    traces = list((run_dir / "traces").glob("*.json*")) if job.profiled else []
    backend = "gloo+CUDA" if job.shared_gpu and check.cuda else "nccl" if check.cuda else "gloo"
    line = (f"{job.nproc} rank(s) on {backend}: {seconds:.0f} s, "
            f"{len(list(run_dir.glob('rank-*')))} rank files"
            + (f", {len(traces)} profiler traces" if job.profiled else ""))  # fmt: skip
    return ("PASS" if not job.profiled or traces else "FAIL"), line, {"seconds": seconds}


def _torchrun(check: Check, name: str, args: list[str], nproc: int, env: dict[str, str],
              timeout_s: float) -> tuple[int, str, float]:  # fmt: skip
    """Run under torchrun (a single-node rendezvous on localhost); exit code, log, seconds."""
    (check.out / "logs").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *args]  # fmt: skip
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
        **env,
    }
    if not check.cuda:  # a dry run on a GPU machine stays on CPU too
        full_env["CUDA_VISIBLE_DEVICES"] = ""
    t0 = time.monotonic()
    # its own process group: on a timeout torchrun and every rank it started go (a rank left
    # behind would hold the GPU for the steps after)
    proc = subprocess.Popen(cmd, env=full_env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=timeout_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        code, log = 124, f"{log}\ntimed out after {timeout_s:.0f} s"
    (check.out / "logs" / f"{name}.log").write_text(log)
    return code, log, time.monotonic() - t0


# --- what the collectors wrote ----------------------------------------------------------------


def collectors_of(check: Check, job: str) -> tuple[str, str, dict]:
    """The collectors' CUDA fields in the job's records: each span's CUDA-event time against
    its wall time, the six memory categories against the allocator's peak, fragmentation, and
    pynvml's utilisation and memory in the step records."""
    run_dir = check.runs.get(job)
    if run_dir is None:
        return "SKIP", "the job did not run", {}
    records = [json.loads(line) for f in sorted(run_dir.glob("rank-*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]  # fmt: skip
    spans = [r for r in records if r.get("kind") == "span" and r.get("device_ms") is not None]
    ratios = sorted(r["device_ms"] / max((r["t1"] - r["t0"]) / 1e6, 1e-9) for r in spans)
    memory = [r for r in records if r.get("kind") == "mem"]
    last = memory[-1] if memory else {}
    categories = ("params", "grads", "optimizer", "activations", "comm_buffers")
    counted = sum(last.get(c) or 0 for c in categories)
    devices = [r["device"] for r in records if r.get("kind") == "step" and r.get("device")]
    figures = {
        "spans_timed": len(spans),
        "device_over_wall_median": ratios[len(ratios) // 2] if ratios else None,
        "last_memory": last, "categories_bytes": counted,
        "nvml_util_pct": [d.get("util_pct") for d in devices][-5:],
        "nvml_mem_used_bytes": [d.get("mem_used_bytes") for d in devices][-5:],
    }  # fmt: skip
    peak = last.get("device_peak")
    ok = bool(spans) and bool(devices) and last.get("fragmentation") is not None and bool(peak)
    ok = ok and counted <= 1.05 * peak  # what the categories count the allocator held
    median = figures["device_over_wall_median"]
    line = (f"{len(spans)} spans timed by CUDA events (device/wall median "
            f"{median if median is None else round(median, 2)}); categories {counted / 2**20:.1f}"
            f" MiB vs allocator peak {(peak or 0) / 2**20:.1f} MiB; fragmentation "
            f"{last.get('fragmentation')} B; nvml util {figures['nvml_util_pct']}")  # fmt: skip
    return ("PASS" if ok else "FAIL"), line, figures


# --- diag's analysis, and HTA's beside it --------------------------------------------------------


def analyze(check: Check, job: str) -> tuple[str, str, dict]:
    """`diag analyze` of the run directory and of its trace folder (with HTA's tables where
    HTA is installed); each main finding, and HTA's breakdown beside diag's."""
    from diag.api import analyze_path

    run_dir = check.runs.get(job)
    if run_dir is None:
        return "SKIP", "the job did not run", {}
    reports = check.out / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stderr(io.StringIO()):
        of_run = analyze_path(run_dir)
        traces = run_dir / "traces"
        hta = _version("hta") is not None and check.cuda
        of_traces = analyze_path(traces, hta=hta) if traces.is_dir() else None
    (reports / f"{job}-run.json").write_text(json.dumps(of_run, indent=1, default=str))
    figures: dict[str, Any] = {"run": _main(of_run)}
    if of_traces is not None:
        (reports / f"{job}-traces.json").write_text(json.dumps(of_traces, indent=1, default=str))
        figures["traces"] = _main(of_traces)
        figures["beside_hta"] = _beside_hta(of_traces)
    beside = figures.get("beside_hta", {})
    line = (f"run dir: {figures['run']}; traces: {figures.get('traces', 'none')}; "
            f"{beside.get('line', 'HTA not run')}")  # fmt: skip
    # diag's breakdown and idle split must equal HTA's to a point where HTA ran
    worst = max(
        beside.get("worst_points", 0.0), beside.get("idle_split", {}).get("worst_points", 0.0)
    )
    return ("PASS" if worst <= 1.0 else "FAIL"), line, figures


def _main(report: dict[str, Any]) -> str:
    findings = report.get("findings") or []
    if not findings:
        return "no finding"
    f = findings[0]
    return f"{f['rule']} {f['severity']} ranks {f.get('ranks')}"


def _beside_hta(report: dict[str, Any]) -> dict[str, Any]:
    """diag's device time and idle split next to HTA's, per rank (points of difference)."""
    hta = report.get("hta") or {}
    if not hta.get("temporal_breakdown"):
        return {"line": f"HTA: {hta.get('errors') or 'not run'}"}
    ours = {d["rank"]: d for d in report.get("device") or []}
    rows, worst = [], 0.0
    for t in hta["temporal_breakdown"]:
        d = ours.get(t["rank"]) or {}
        diff = {k: abs(100 * (d.get(f"{k}_share") or 0) - t[f"{k}_time_pctg"])
                for k in ("idle", "compute", "non_compute")}  # fmt: skip
        worst = max(worst, *diff.values())
        rows.append({"rank": t["rank"], "hta": {k: t[f"{k}_time_pctg"] for k in diff},
                     "diag": {k: d.get(f"{k}_share") for k in diff}})  # fmt: skip
    split = _idle_split_beside_hta(hta, ours)
    return {"rows": rows, "worst_points": worst, "idle_split": split,
            "line": f"diag vs HTA temporal breakdown within {worst:.2f} points; idle split "
                    f"(host/kernel/other) {split.get('line', 'n/a')}"}  # fmt: skip


def _idle_split_beside_hta(hta: dict[str, Any], ours: dict[Any, dict[str, Any]]) -> dict:
    """HTA's idle time breakdown (its first rank, summed over streams) against diag's."""
    rows = hta.get("idle_time_breakdown") or []
    if not rows:
        return {}
    rank = rows[0].get("rank")
    sums: dict[str, float] = {}
    for row in rows:
        sums[row["idle_category"]] = sums.get(row["idle_category"], 0.0) + row["idle_time"]
    total = sum(sums.values()) or 1.0
    theirs = [100 * sums.get(k, 0.0) / total for k in ("host_wait", "kernel_wait", "other")]
    d = ours.get(rank) or {}
    mine = [100 * (d.get(k) or 0.0) for k in
            ("host_wait_share", "kernel_wait_share", "other_idle_share")]  # fmt: skip
    worst = max(abs(a - b) for a, b in zip(theirs, mine, strict=True))
    shown = "/".join(f"{v:.0f}" for v in mine), "/".join(f"{v:.0f}" for v in theirs)
    return {"rank": rank, "diag": mine, "hta": theirs, "worst_points": worst,
            "line": f"rank {rank}: diag {shown[0]}% vs HTA {shown[1]}%"}  # fmt: skip


def diagnosed(check: Check, job: str, expect: str, what: str) -> tuple[str, str, dict]:
    """Whether the run directory and the traces name the injected fault (`expect`: a rule)."""
    reports = check.out / "reports"
    found = {}
    for source in ("run", "traces"):
        path = reports / f"{job}-{source}.json"
        if not path.is_file():
            found[source] = None
            continue
        findings = json.loads(path.read_text()).get("findings") or []
        hit = next((f for f in findings if f["rule"] == expect), None)
        first = findings[0]["rule"] if findings else None
        found[source] = {"named": hit is not None, "first": first,
                         "ranks": hit.get("ranks") if hit else None}  # fmt: skip
    run_ok = bool(found.get("run") and found["run"]["named"])
    line = "; ".join(f"{s}: " + ("absent" if v is None else
                                 f"{expect} {'named' if v['named'] else 'not named'} "
                                 f"(first {v['first']}, ranks {v['ranks']})")
                     for s, v in found.items())  # fmt: skip
    return ("PASS" if run_ok else "FAIL"), f"{what}: {line}", found


# --- the whole check ------------------------------------------------------------------------------


def run_check(out: Path, dry_run: bool, budget_s: float, only: set[str] | None) -> list[Outcome]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, dry_run, torch.cuda.is_available() and not dry_run, budget_s)

    def wanted(name: str) -> bool:
        return only is None or any(name.startswith(o) for o in only)

    steps: list[tuple[str, bool, Callable[[], tuple[str, str, dict]]]] = [
        ("environment", False, lambda: environment(check)),
        ("nccl_two_ranks_one_gpu", True, lambda: nccl_two_ranks_one_gpu(check)),
        ("allocator_events_nvml", True, lambda: allocator_and_events(check)),
    ]
    for job in jobs(check):
        steps.append((job.name, False, _bind(run_job, check, job)))  # on CPU in a dry run
        steps.append((f"{job.name}:collectors", True, _bind(collectors_of, check, job.name)))
        steps.append((f"{job.name}:analyze", False, _bind(analyze, check, job.name)))
    steps += [
        ("straggler_diagnosed", False,
         lambda: diagnosed(check, "dp_straggler_2", "BAL001", "rank 1 sleeps 40 ms")),
        ("leak_diagnosed", False,
         lambda: diagnosed(check, "dp_leak_1", "TRD002", "a leak retained every step")),
    ]  # fmt: skip
    for name, needs_cuda, fn in steps:
        if wanted(name):
            check.step(name, needs_cuda, fn)
    _write_summary(check)
    return check.outcomes


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _write_summary(check: Check) -> None:
    counts = {
        s: sum(o.status == s for o in check.outcomes) for s in ("PASS", "FAIL", "SKIP", "INFO")
    }
    head = (f"gpu_check {'(dry run) ' if check.dry_run else ''}"
            f"{time.monotonic() - check.started:.0f} s: "
            + ", ".join(f"{n} {s}" for s, n in counts.items()))  # fmt: skip
    text = "\n".join([head, *(_summary_line(o) for o in check.outcomes)]) + "\n"
    (check.out / "summary.txt").write_text(text)
    (check.out / "summary.json").write_text(json.dumps(
        {"dry_run": check.dry_run, "cuda": check.cuda, "counts": counts,
         "steps": [asdict(o) for o in check.outcomes]}, indent=1, default=str))  # fmt: skip
    print(head, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the summary and the evidence")
    dry = "on CPU: the jobs on gloo, every step that needs CUDA skipped"
    parser.add_argument("--dry-run", action="store_true", help=dry)
    budget = "steps that would start after this many seconds are skipped (default 420)"
    parser.add_argument("--budget-s", type=float, default=420.0, help=budget)
    only = "comma-separated step names (or their prefixes) to run"
    parser.add_argument("--only", default=None, help=only)
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    outcomes = run_check(args.out, args.dry_run, args.budget_s, only)
    return 1 if any(o.status == "FAIL" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
