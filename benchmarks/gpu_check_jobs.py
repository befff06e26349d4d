"""benchmarks/gpu_check.py's jobs: the DP trainer and examples/own_loop.py under torchrun (NCCL
with one rank, gloo with two ranks sharing the GPU, one profiled), the collectors' CUDA fields
of each against wall time and the allocator, `diag analyze` of each run directory and trace
folder with HTA's figures beside diag's (`beside_hta`), whether an injected fault is named, and
whether NCCL lets two ranks share the one GPU."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.gpu_check_env import package_version

if TYPE_CHECKING:
    from benchmarks.gpu_check import Check

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 180
"""One job (torchrun) at most; a hung NCCL init must not eat the whole budget."""
PROBE_TIMEOUT_S = 90


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
    code, log, _ = torchrun(check, "nccl_probe", [str(probe)], 2, {}, PROBE_TIMEOUT_S)
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
    code, log, seconds = torchrun(check, job.name, [*args, "--out", str(run_dir), *job.args],
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


def torchrun(check: Check, name: str, args: list[str], nproc: int, env: dict[str, str],
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
        hta = package_version("hta") is not None and check.cuda
        of_traces = analyze_path(traces, hta=hta) if traces.is_dir() else None
    (reports / f"{job}-run.json").write_text(json.dumps(of_run, indent=1, default=str))
    figures: dict[str, Any] = {"run": _main(of_run)}
    if of_traces is not None:
        (reports / f"{job}-traces.json").write_text(json.dumps(of_traces, indent=1, default=str))
        figures["traces"] = _main(of_traces)
        figures["beside_hta"] = beside_hta(of_traces)
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


def beside_hta(report: dict[str, Any]) -> dict[str, Any]:
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
