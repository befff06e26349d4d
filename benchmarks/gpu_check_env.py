"""benchmarks/gpu_check.py's in-process steps: the environment (versions, the device, NVML), the
allocator's figures, CUDA-event timing and pynvml against torch's own, (whether NCCL lets two ranks
share the one GPU is a job: benchmarks/gpu_check_jobs.py)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.gpu_check import Check

PACKAGES = ("torch", "pandas", "pyarrow", "numba", "click", "msgspec", "pynvml", "hta", "plotly")
"""What diag needs on the device machine (`hta` and `plotly` for HTA's figures, `msgspec` for
fast trace reading: carried as wheels where the image lacks them)."""


# --- the environment and the in-process checks ---------------------------------------------


def environment(check: Check) -> tuple[str, str, dict]:
    import torch

    env: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda, "cpus": os.cpu_count(),
        "packages": {name: package_version(name) for name in PACKAGES},
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


def package_version(name: str) -> str | None:
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
