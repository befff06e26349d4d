"""The communication and memory ledger: the formulas of docs/physics.md as pure functions.

Units are in the names: `_bytes`, `_fraction`. Nothing here reads files or touches torch.
"""

from __future__ import annotations

from typing import NamedTuple


def bus_factor(op: str, group_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor, algbw = size / time.

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1
    (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
    """
    n = max(int(group_size), 1)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


# --- Memory -------------------------------------------------------------------------------------

ADAM_OPTIMIZER_BYTES_PER_PARAM = 12
"""fp32 master 4 + Adam m 4 + Adam v 4 (the K of the ZeRO paper)."""


def activation_bytes_per_layer(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Activation bytes of one transformer layer, 16-bit activations (Korthikanti 2022, Table 2).

    tp = 1: s*b*h*(34 + 5*a*s/h). Tensor parallel: s*b*h*(10 + 24/t + 5*a*s/(h*t)).
    Tensor + sequence parallel: s*b*h/t * (34 + 5*a*s/h).
    `recompute="selective"` recomputes the attention scores: the 5*a*s/h term goes (s*b*h*34
    with tp = 1). `recompute="full"` keeps only the layer's input, 2*s*b*h (/t with sequence
    parallelism), and runs the forward again in backward.
    """
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("hidden", hidden)):
        _require(value >= 1, f"{name} must be >= 1, got {value}")
    _require(heads >= 1, f"heads must be >= 1, got {heads}")
    _require(tp >= 1, f"tp must be >= 1, got {tp}")
    _require(recompute in RECOMPUTE, f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tp
    scores = 0.0 if recompute == "selective" else 5 * a * s / h
    if recompute == "full":
        return 2 * s * b * h / (t if sequence_parallel else 1)
    if sequence_parallel or t == 1:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)


RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation strategies `activation_bytes_per_layer` knows."""


def static_state_bytes(params: float, bytes_per_param: float = 16) -> float:
    """Parameters, gradients and Adam state of mixed-precision training: 16 B/param (bf16
    params 2 + grads 2 + fp32 master 4 + m 4 + v 4; SEED §1): 70B -> 1.12 TB, 13B -> 208 GB."""
    _require(params >= 0, f"params must be >= 0, got {params}")
    return params * bytes_per_param


# --- Pipeline -----------------------------------------------------------------------------------


def bubble_fraction(pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Share of a step the pipeline idles: (p-1)/(m+p-1) (GPipe/1F1B; SEED §2 PP).

    Interleaved 1F1B (Narayanan 2021, arXiv 2104.04473) divides the bubble *time* by v:
    (p-1)/v over a step of m + (p-1)/v micro-batch slots, i.e. (p-1)/(v*m + p-1).
    p=8, m=4 gives 7/11 = 63.6%; the digest's "46.7%" is 7/15, i.e. p=8, m=8.
    """
    _require(pp >= 1, f"pp must be >= 1, got {pp}")
    _require(microbatches >= 1, f"microbatches must be >= 1, got {microbatches}")
    _require(virtual_stages >= 1, f"virtual_stages must be >= 1, got {virtual_stages}")
    return (pp - 1) / (virtual_stages * microbatches + pp - 1)


# --- Communication: DP --------------------------------------------------------------------------


def dp_grad_payload_bytes(params: float, grad_dtype_bytes: float) -> float:
    """Gradient bytes one rank all-reduces per DP sync: P x dtype bytes (SEED §2 DP)."""
    _require(params >= 0, f"params must be >= 0, got {params}")
    return params * grad_dtype_bytes


def ring_allreduce_wire_bytes(payload_bytes: float, n: int) -> float:
    """Bytes a ring all-reduce sends per rank: 2(n-1)/n x payload (SEED §2 DP; nccl-tests)."""
    _require(n >= 1, f"group size n must be >= 1, got {n}")
    return 2 * (n - 1) / n * payload_bytes


# --- Communication: TP, PP, EP ------------------------------------------------------------------


def tp_allreduce_bytes(micro_batch: int, seq_len: int, hidden: int, dtype_bytes: float) -> float:
    """Payload of one Megatron TP all-reduce: b x s x h x dtype (Shoeybi 2019; SEED §2 TP)."""
    return micro_batch * seq_len * hidden * dtype_bytes


class TpAllreduceCount(NamedTuple):
    """TP all-reduces per step by phase."""

    forward: int
    backward: int


def tp_allreduce_count(layers: int, microbatches: int) -> TpAllreduceCount:
    """TP all-reduces per step: forward 2*L*M and backward 2*L*M (Megatron; SEED §2 TP)."""
    _require(layers >= 0 and microbatches >= 0, f"got layers={layers}, mb={microbatches}")
    return TpAllreduceCount(forward=2 * layers * microbatches, backward=2 * layers * microbatches)


def pp_boundary_bytes(micro_batch: int, seq_len: int, hidden: int, dtype_bytes: float) -> float:
    """One stage-boundary activation send (= one gradient send back): b*s*h*dtype (SEED §2)."""
    return micro_batch * seq_len * hidden * dtype_bytes


def zero3_allgather_bytes(layer_params: float, dtype_bytes: float) -> float:
    """One ZeRO-3 / FSDP unit's all-gather payload (its unsharded parameters), once in forward
    and again in backward, with one reduce-scatter of its gradients (SEED §2 ZeRO)."""
    return layer_params * dtype_bytes


def cp_kv_bytes(micro_batch: int, seq_len: int, kv_hidden: int, dtype_bytes: float) -> float:
    """Keys and values one context-parallel rank gathers per layer in forward: the whole
    sequence's K and V, 2 x b x s x kv_hidden x dtype (ring attention passes the same bytes)."""
    return 2 * micro_batch * seq_len * kv_hidden * dtype_bytes


def ep_alltoall_bytes(tokens: int, topk: int, hidden: int, dtype_bytes: float) -> float:
    """Expected MoE all-to-all bytes per direction: tokens x topk x hidden x dtype (SEED §2 EP)."""
    return tokens * topk * hidden * dtype_bytes


# --- Dtypes and model size ----------------------------------------------------------------------

_DTYPE_BYTES: dict[str, int] = {
    **dict.fromkeys(("float64", "fp64", "f64", "double"), 8),
    **dict.fromkeys(("float32", "fp32", "f32", "float", "tf32"), 4),
    **dict.fromkeys(("bfloat16", "bf16", "float16", "fp16", "f16", "half"), 2),
    **dict.fromkeys(("float8", "fp8", "float8_e4m3fn", "float8_e4m3fnuz", "e4m3"), 1),
    **dict.fromkeys(("float8_e5m2", "float8_e5m2fnuz", "e5m2"), 1),
    **dict.fromkeys(("int64", "long", "uint64"), 8),
    **dict.fromkeys(("int32", "int", "uint32"), 4),
    **dict.fromkeys(("int16", "short", "uint16"), 2),
    **dict.fromkeys(("int8", "uint8", "bool"), 1),
}


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name ("bf16", "float32", "torch.float32", ...)."""
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[key]


def gpt_param_count(
    layers: int,
    hidden: int,
    vocab: int,
    seq_len: int,
    ffn_hidden: int | None = None,
    tied_embeddings: bool = True,
) -> int:
    """GPT-2-style parameter count, f = ffn_hidden (default 4h), learned positions, biases.

    L*(4h^2+4h + 2hf+f+h + 4h) + V*h + seq*h + 2h (+ V*h if the LM head is untied):
    attention qkv 3h^2+3h and proj h^2+h, MLP h*f+f and f*h+h, two LayerNorms 2h each.
    """
    for name, value in (("layers", layers), ("hidden", hidden), ("vocab", vocab)):
        _require(value >= 1, f"{name} must be >= 1, got {value}")
    _require(seq_len >= 0, f"seq_len must be >= 0, got {seq_len}")
    h = hidden
    f = 4 * h if ffn_hidden is None else ffn_hidden
    _require(f >= 1, f"ffn_hidden must be >= 1, got {f}")
    per_layer = (4 * h * h + 4 * h) + (2 * h * f + f + h) + 4 * h
    embeddings = vocab * h + seq_len * h
    head = 0 if tied_embeddings else vocab * h
    return layers * per_layer + embeddings + 2 * h + head
