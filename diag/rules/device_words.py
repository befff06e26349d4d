"""How a finding names the device and CUDA's remedies where the device is another: an MTIA or
an Intel GPU, whose profiler events diag reads as CUDA's (diag/read/kineto/convert.py), gets
neither "GPU" nor `torch.cuda` in its findings. From the manifest's `device_type`."""

from __future__ import annotations

NAMES = {"mtia": "MTIA", "xpu": "XPU", "privateuse1": "device"}
"""The device's name in a title; a GPU's (CUDA's, ROCm's through the same API) elsewhere."""
REMEDIES = (
    ("torch.cuda.synchronize()", "the device's synchronize()"),
    ("torch.cuda.graphs", "the backend's graph capture"),
    ("CUDA graphs", "graph capture"),
    ("CUDA_LAUNCH_BLOCKING", "the backend's blocking-launch setting"),
    ("GPU tensors", "device tensors"),
)
"""CUDA's names in the advice and what they are for another device."""


def device_word(device_type: str | None) -> str:
    """`GPU`, or the other device's name."""
    return NAMES.get(device_type or "", "GPU")


def for_device(advice: str, device_type: str | None) -> str:
    """`advice` with CUDA's remedies named for the device (unchanged for a GPU)."""
    if device_type not in NAMES:
        return advice
    for cuda, other in REMEDIES:
        advice = advice.replace(cuda, other)
    return advice
