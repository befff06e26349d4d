"""Activation bytes of one transformer block, counted tensor by tensor for the block the job trains:
Korthikanti et al. 2022 (arXiv 2205.05198, section 4.1) generalised to grouped-query attention,
gated (SwiGLU) MLPs of any width, training without dropout and fused (flash) attention. For their
GPT block (multi-head, 4h GeLU MLP, dropout, scores stored) it is their `s b h (34 + 5 a s / h)`
exactly (tests/unit/test_plan.py holds it equal to diag.contract.ledger's).

What the backward needs, 16-bit unless said, for s tokens of b sequences, width h, key/value
width h_kv, MLP width f (each routed token counts topk times in a mixture of experts):
- attention: the norm's input 2sbh; the QKV projection's input 2sbh; Q 2sbh, K and V
  2sb h_kv each; the output projection's input 2sbh; its dropout mask sbh (1 byte);
  without flash attention the scores: softmax output 2 a s^2 b, and with dropout its mask
  a s^2 b and output 2 a s^2 b;
- MLP: the norm's input 2sbh; the first projection's input 2sbh; its output 2sbf (twice,
  gate and up, when gated); the second projection's input 2sbf; its dropout mask sbh.
With tensor parallelism the Q, K, V, projection inputs and MLP widths are split t ways; with
sequence parallelism everything is (Korthikanti's `/t`). Selective recomputation drops the
scores; full recomputation keeps only the block's input 2sbh (/t with sequence parallelism).
"""

from __future__ import annotations

from diag.plan.job import Training
from simulator.config import ModelSpec


def block_activation_bytes(
    model: ModelSpec,
    training: Training,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Bytes one block keeps for its backward on one GPU, for `seq_len` tokens of `micro_batch`
    sequences (the GPU's share of the sequence under context parallelism)."""
    s, b, h, t = seq_len, micro_batch, model.hidden, tp
    sbh = s * b * h
    sp = sequence_parallel and t > 1
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    mask = 1.0 if training.dropout else 0.0  # bytes per element of a dropout mask
    routed = model.topk if model.experts else 1
    ffn = model.ffn / h * routed  # MLP rows per token, in units of h
    # split over t by tensor parallelism alone (Korthikanti's 24 / t of the 34)
    split = (2 + 4 * model.kv_hidden / h + 2) + ffn * (2 * (2 if model.gated_mlp else 1) + 2)
    # kept whole on every TP rank unless sequence parallelism splits them (his 10)
    whole = (2 + 2 + mask) + (2 + 2 + mask)
    scores = 0.0
    if not training.flash_attention and recompute != "selective":
        scores = (2 + 3 * mask) * model.heads * s / h  # softmax out; dropout mask and out
    if sp or t == 1:
        return sbh / t * (whole + split + scores)
    return sbh * (whole + split / t + scores / t)
