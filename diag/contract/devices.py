"""Known accelerators: memory, peak dense FLOP/s, link bandwidths and the share of the peak a
training step's compute reaches (standard library only).

One table for every consumer: MFU in the summary (peak FLOP/s of the device a run names),
`diag plan` (memory, peak, links and compute efficiency of the cluster it lays a model out
on) and the simulator's defaults. Figures are the vendors' datasheet values for the SXM/OAM
parts, dense (no 2:4 sparsity), bf16:
- H100 SXM 80 GB: 989 TFLOP/s, NVLink 4 900 GB/s per GPU (both directions), HBM3 3.35 TB/s.
- H200 SXM 141 GB: 989 TFLOP/s (the H100's compute), NVLink 4, HBM3e 4.8 TB/s.
- B200 (HGX) 180 GB: 2,250 TFLOP/s, NVLink 5 1,800 GB/s, HBM3e 8 TB/s.
- A100 SXM 80 GB: 312 TFLOP/s, NVLink 3 600 GB/s, HBM2e 2.04 TB/s.
- V100 SXM 32 GB: 125 TFLOP/s fp16 tensor cores (Volta has no bf16; its jobs trained in
  fp16), NVLink 2 300 GB/s, HBM2 900 GB/s; a DGX-2 node: 16 GPUs on NVSwitch and 8 x 100 Gb/s
  EDR InfiniBand, 6.25 GB/s per GPU (Shoeybi et al. 2019, arXiv 1909.08053, section 5: 300
  GB/s between GPUs inside a server, 100 GB/s between servers).
- MI300X 192 GB: 1,307 TFLOP/s, Infinity Fabric 896 GB/s aggregate peer links, HBM3 5.3 TB/s.
Inter-node bandwidth is one NIC per GPU: 400 Gb/s (50 GB/s) for NDR InfiniBand or 400G
Ethernet; HDR (200 Gb/s, 25 GB/s) for the A100 generation.

`compute_efficiency` is what `diag plan` multiplies the peak by for the time of a step's
FLOPs: the share of the peak a large transformer's kernels (its GEMMs, attention and the
element-wise work between them) reach in training. It is an end-to-end figure's, not a GEMM
benchmark's: chosen so that the plan's model (this share for compute, plus its communication
and bubble) gives the published MFU/HFU of each generation's published jobs:
- V100 0.30: Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053) sustains 39 TFLOP/s, 30% of
  peak, on one V100 (no communication: the compute's own share), and 15.1 PFLOP/s on 512
  V100s for 8.3B at TP 8 x DP 64 (29.5 TFLOP/s each, 23.6%, counting the recomputed
  forward); ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054) trains 100B on 400 V100s at 15
  PFLOP/s (38 TFLOP/s, 30%). The plan prices the 8.3B job at 24.8% HFU (37.0% at 0.5).
  (Megatron's 2020 release reached 62.4 TFLOP/s, 48%, on one V100 after kernel fusion,
  nv-adlr.github.io/MegatronLMV1: a tuned single GPU, not a job at scale.)
- A100 0.55: Narayanan et al. 2021 (arXiv 2104.04473) 44-52% of peak end to end from 1B to
  1T on up to 3,072 A100s (502 PFLOP/s, 52%, for 1T), counting the recomputed forward;
  Korthikanti et al. 2022 (arXiv 2205.05198, and the Megatron-LM README) MFU 56.3% and HFU
  57.0% for 1T (data-parallel size 1), MFU 54.2% for 530B on 2,240 A100s; MT-NLG 530B (Smith
  et al. 2022, arXiv 2201.11990) ~126 TFLOP/s, 40%. The 2021-22 jobs span 0.5-0.6: at 0.55
  the plan gives Megatron's 1T 47.2% HFU (52% published) and MT-NLG 44.4% (40%).
- H100 0.50: Llama 3 405B (Dubey et al. 2024, arXiv 2407.21783, Table 4) 38-43% BF16 MFU on
  8K-16K H100s (400 TFLOP/s at 16K); at 0.50 the plan gives its published layout 39.0%.
- H200 0.50: the H100's compute die and software; no separate published large-job figure.
- B200 0.50 and MI300X 0.50: no published large-scale BF16 training MFU was found to check
  against; the H100's value stands in (for the MI300X likely high: third-party benchmarks
  report its BF16 GEMMs well under half of its datasheet peak). Give `--compute-efficiency`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator model and the links a typical node of it has."""

    key: str  # short name used on the command line: h100, h200, b200, a100, v100, mi300x
    name: str
    peak_tflops_bf16: float  # dense bf16 tensor-core peak of one device (V100: fp16)
    memory_gb: float  # device memory, GB = 1e9 bytes
    hbm_GBps: float
    intra_node_GBps: float  # scale-up link bandwidth per GPU (NVLink, Infinity Fabric)
    inter_node_GBps: float  # scale-out bandwidth per GPU (one NIC)
    gpus_per_node: int
    name_pattern: str  # regex matched (case-insensitive) against a device name a run reports
    compute_efficiency: float = 0.5
    """Share of the peak a training step's compute reaches (the table in the docstring)."""

    @property
    def peak_flops_per_s(self) -> float:
        return self.peak_tflops_bf16 * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


DEVICES: dict[str, DeviceSpec] = {
    spec.key: spec
    for spec in (
        DeviceSpec(
            "h100", "NVIDIA H100 SXM 80GB", 989.0, 80.0, 3350.0, 900.0, 50.0, 8, r"h100", 0.50
        ),
        DeviceSpec(
            "h200", "NVIDIA H200 SXM 141GB", 989.0, 141.0, 4800.0, 900.0, 50.0, 8, r"h200", 0.50
        ),
        DeviceSpec(
            "b200", "NVIDIA B200 180GB", 2250.0, 180.0, 8000.0, 1800.0, 50.0, 8, r"b200", 0.50
        ),
        DeviceSpec(
            "a100", "NVIDIA A100 SXM 80GB", 312.0, 80.0, 2039.0, 600.0, 25.0, 8, r"a100", 0.55
        ),
        DeviceSpec(
            "v100", "NVIDIA V100 SXM 32GB", 125.0, 32.0, 900.0, 300.0, 6.25, 16, r"v100", 0.30
        ),
        DeviceSpec(
            "mi300x", "AMD Instinct MI300X", 1307.0, 192.0, 5300.0, 896.0, 50.0, 8, r"mi300x", 0.50
        ),
    )
}


def device_by_key(key: str) -> DeviceSpec:
    """The table's entry for `key` (h100, h200, b200, a100, v100, mi300x); KeyError naming the
    choices."""
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
