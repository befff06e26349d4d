"""GPU-only measurements: pynvml device samples and CUDA-event timing of device work.

On a machine without CUDA (or without the NVML library) these are absent, never faked: the
factories return None and the recorder writes no such fields.
"""

from __future__ import annotations

from typing import Any

import torch

from collectors.safety import report_once


class NvmlSampler:
    """Samples utilisation, memory used, SM clock, temperature and power of one GPU per step.

    A throttled straggler (low SM clock, high temperature or power at its cap) can then be told
    from a rank that is slow for another reason.
    """

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self._nvml = pynvml
        self._handle = handle

    @classmethod
    def create(cls, device: torch.device) -> NvmlSampler | None:
        if device.type != "cuda":
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
        except Exception as err:
            report_once("NvmlSampler.create", err)
            return None

    def sample(self) -> dict[str, float]:
        nvml, h = self._nvml, self._handle
        util = nvml.nvmlDeviceGetUtilizationRates(h)
        return {
            "util_pct": float(util.gpu),
            "mem_used_bytes": float(nvml.nvmlDeviceGetMemoryInfo(h).used),
            "sm_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            "temperature_c": float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        }


class CudaSpanTimer:
    """Times device work of spans with CUDA events, resolved lazily (no forced sync per step).

    `start()` and `stop()` record events on the current stream; `resolve()` returns the records
    whose end event has completed, with `device_ms` filled in, and keeps the others for later.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[dict[str, Any], Any, Any]] = []

    @classmethod
    def create(cls, device: torch.device) -> CudaSpanTimer | None:
        if device.type != "cuda" or not torch.cuda.is_available():
            return None
        return cls()

    def start(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, record: dict[str, Any], start_event: Any) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((record, start_event, end))

    def resolve(self, wait: bool = False) -> list[dict[str, Any]]:
        done, keep = [], []
        for record, start, end in self._pending:
            if wait:
                end.synchronize()
            if end.query():
                record["device_ms"] = start.elapsed_time(end)
                done.append(record)
            else:
                keep.append((record, start, end))
        self._pending = keep
        return done
