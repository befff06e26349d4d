"""Known accelerators: memory, peak dense bf16 FLOP/s and link bandwidths (standard library only).

One table for every consumer: MFU in the summary (peak FLOP/s of the device a run names),
`diag plan` (memory, peak, links of the cluster it lays a model out on) and the simulator's
defaults. Figures are the vendors' datasheet values for the SXM/OAM parts, dense (no 2:4
sparsity), bf16:
- H100 SXM 80 GB: 989 TFLOP/s, NVLink 4 900 GB/s per GPU (both directions), HBM3 3.35 TB/s.
- H200 SXM 141 GB: 989 TFLOP/s (the H100's compute), NVLink 4, HBM3e 4.8 TB/s.
- B200 (HGX) 180 GB: 2,250 TFLOP/s, NVLink 5 1,800 GB/s, HBM3e 8 TB/s.
- A100 SXM 80 GB: 312 TFLOP/s, NVLink 3 600 GB/s, HBM2e 2.04 TB/s.
- MI300X 192 GB: 1,307 TFLOP/s, Infinity Fabric 896 GB/s aggregate peer links, HBM3 5.3 TB/s.
Inter-node bandwidth is one NIC per GPU: 400 Gb/s (50 GB/s) for NDR InfiniBand or 400G
Ethernet; HDR (200 Gb/s, 25 GB/s) for the A100 generation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator model and the links a typical node of it has."""

    key: str  # short name used on the command line: h100, h200, b200, a100, mi300x
    name: str
    peak_tflops_bf16: float  # dense bf16 tensor-core peak of one device
    memory_gb: float  # device memory, GB = 1e9 bytes
    hbm_GBps: float
    intra_node_GBps: float  # scale-up link bandwidth per GPU (NVLink, Infinity Fabric)
    inter_node_GBps: float  # scale-out bandwidth per GPU (one NIC)
    gpus_per_node: int
    name_pattern: str  # regex matched (case-insensitive) against a device name a run reports

    @property
    def peak_flops_per_s(self) -> float:
        return self.peak_tflops_bf16 * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


DEVICES: dict[str, DeviceSpec] = {
    spec.key: spec
    for spec in (
        DeviceSpec("h100", "NVIDIA H100 SXM 80GB", 989.0, 80.0, 3350.0, 900.0, 50.0, 8, r"h100"),
        DeviceSpec("h200", "NVIDIA H200 SXM 141GB", 989.0, 141.0, 4800.0, 900.0, 50.0, 8, r"h200"),
        DeviceSpec("b200", "NVIDIA B200 180GB", 2250.0, 180.0, 8000.0, 1800.0, 50.0, 8, r"b200"),
        DeviceSpec("a100", "NVIDIA A100 SXM 80GB", 312.0, 80.0, 2039.0, 600.0, 25.0, 8, r"a100"),
        DeviceSpec(
            "mi300x", "AMD Instinct MI300X", 1307.0, 192.0, 5300.0, 896.0, 50.0, 8, r"mi300x"
        ),
    )
}


def device_by_key(key: str) -> DeviceSpec:
    """The table's entry for `key` (h100, h200, b200, a100, mi300x); KeyError naming the choices."""
    try:
        return DEVICES[key.lower()]
    except KeyError:
        raise KeyError(f"unknown device {key!r}; known: {', '.join(DEVICES)}") from None


def device_for_name(device_name: str | None) -> DeviceSpec | None:
    """The known device a reported name (`torch.cuda.get_device_name`, a manifest's `device`)
    is, or None (a CPU, an unknown part, no name). A simulated device counts as its model."""
    if not device_name:
        return None
    for spec in DEVICES.values():
        if re.search(spec.name_pattern, device_name, re.IGNORECASE):
            return spec
    return None
