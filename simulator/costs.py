"""Costs: FLOPs -> seconds on the device, bytes -> seconds on the links (alpha-beta).

Compute (Narayanan et al. 2021, arXiv 2104.04473, appendix: 24·b·s·h² + 4·b·s²·h forward FLOPs
per GPT layer with a 4h MLP): attention 8·T·h² + 4·b·s²·h, MLP 4·T·h·f, LM head 2·T·h·V, with
T = b·s tokens; backward is twice the forward; tensor parallelism divides all of it by tp.

Communication (nccl-tests' bus bandwidth): a collective of `payload` bytes per rank over a group
of n takes `latency + payload x bus_factor(op, n) / (link GB/s x NCCL efficiency)`, on the
intra-node link when all of the group's ranks sit on one host, on the inter-node link otherwise.
`comm_scale` multiplies the whole cost (0: free communication); injected latency comes on top.
"""

from __future__ import annotations

import numpy as np

from diag.contract import ledger
from simulator.config import ModelSpec
from simulator.hardware import HardwareSpec

NS_PER_S = 1e9


def attention_flops(model: ModelSpec) -> float:
    """Forward FLOPs of one layer's attention (QKV, scores, values, projection), one micro-batch."""
    h, b, s = model.hidden, model.micro_batch, model.seq_len
    # q and output projections 2h^2 each, keys and values 2h x kv_hidden (= 2h^2 without GQA)
    projections = 2 * b * s * (2 * h * h + 2 * h * model.kv_hidden)
    return projections + 4 * b * s * s * h


def mlp_flops(model: ModelSpec, tokens: float) -> float:
    """Forward FLOPs of a dense MLP (two GEMMs h x f, three when gated) over `tokens` rows."""
    return (6 if model.gated_mlp else 4) * tokens * model.hidden * model.ffn


def router_flops(model: ModelSpec) -> float:
    return 2 * model.tokens * model.hidden * model.experts


def head_flops(model: ModelSpec) -> float:
    """Forward FLOPs of the LM head (h x vocab) over one micro-batch."""
    return 2 * model.tokens * model.hidden * model.vocab


class Costs:
    """Times in ns of one rank's pieces of work and of collectives on a group placement."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp: int) -> None:
        self.model, self.hw, self.tp = model, hardware, tp
        rate = hardware.flops_per_s / NS_PER_S  # FLOP per ns
        self.attn_fwd_ns = attention_flops(model) / tp / rate
        self.mlp_fwd_ns = mlp_flops(model, model.tokens) / tp / rate
        self.router_fwd_ns = router_flops(model) / rate if model.experts else 0.0
        self.expert_row_fwd_ns = mlp_flops(model, 1) / tp / rate  # one routed token
        self.head_fwd_ns = head_flops(model) / tp / rate if model.lm_head else 0.0

    def collective_ns(
        self, op: str, payload_bytes: float | np.ndarray, group_size: int, cross: np.ndarray | bool
    ) -> np.ndarray:
        """Duration (ns) of one collective: intra-node where `cross` is False, inter-node where
        it is True (arrays broadcast). 0 for a group of one."""
        if group_size <= 1:
            return np.zeros(np.shape(cross)) + 0 * np.asarray(payload_bytes, dtype=float)
        hw = self.hw
        wire = np.asarray(payload_bytes, dtype=float) * ledger.bus_factor(op, group_size)
        intra = hw.intra_latency_us * 1e3 + wire / (hw.intra_node_GBps * hw.nccl_efficiency)
        inter = hw.inter_latency_us * 1e3 + wire / (hw.inter_node_GBps * hw.nccl_efficiency)
        return np.where(cross, inter, intra) * hw.comm_scale  # GB/s = bytes per ns

    def optimizer_ns(self, optimizer_params: float) -> float:
        """Adam over the parameters whose optimizer state this rank holds, bound by HBM: read
        params, grads, fp32 master and moments (16 B/param), write params, master and moments
        (14 B/param)."""
        return 30 * optimizer_params / self.hw.hbm_GBps
