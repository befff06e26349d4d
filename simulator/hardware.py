"""Device and link parameters of the simulated cluster, with the seed's defaults.

docs/physics.md, "Links": NVLink 4 carries 900 GB/s inside a node, InfiniBand NDR 400 Gb/s about 50
GB/s between nodes (an order of magnitude less), and NCCL reaches 70-85% of a link's peak. The
device is an H100 SXM: 989 TFLOP/s dense bf16, 80 GB of HBM3 at 3.35 TB/s. Every value is
overridable (`diag simulate --help`).
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.contract.input_rules import check_device


@dataclass(frozen=True)
class HardwareSpec:
    """What one simulated GPU computes and how fast its links carry bytes."""

    device_name: str = "NVIDIA H100 80GB HBM3 (simulated)"
    device_tflops: float = 989.0  # peak dense bf16 TFLOP/s of one device
    mfu: float = 0.5  # achieved fraction of the peak (model FLOPs utilisation)
    hbm_GBps: float = 3350.0  # device memory bandwidth: the optimizer step is bound by it
    device_memory_gb: float = 80.0  # the budget written to the manifest (GB = 1e9 bytes)
    intra_node_GBps: float = 900.0  # NVLink 4, per GPU
    inter_node_GBps: float = 50.0  # IB NDR 400 Gb/s, one NIC per GPU
    nccl_efficiency: float = 0.8  # share of a link's peak a collective reaches (NCCL 70-85%)
    intra_latency_us: float = 3.0  # fixed cost of one collective inside a node
    inter_latency_us: float = 15.0  # fixed cost of one collective across nodes
    comm_scale: float = 1.0  # multiplies every collective's cost; 0 makes communication free

    def check(self) -> None:
        """ValueError naming the first parameter out of range (the rules `diag plan` applies to its
        device too: diag/contract/input_rules.py)."""
        check_device(self)

    @property
    def flops_per_s(self) -> float:
        """FLOP/s one device achieves."""
        return self.device_tflops * 1e12 * self.mfu

    @property
    def device_memory_bytes(self) -> int:
        return int(self.device_memory_gb * 1e9)
