"""Model presets for `diag plan`: public architectures as the simulator's `ModelSpec`.

Each preset is the paper's or the released config's shape (layers, hidden, heads, FFN width,
vocabulary, sequence length), so that the plan's parameter counts and FLOPs are the model's:
- gpt3-175b: Brown et al. 2020 (96 x 12288, 96 heads, seq 2048); Megatron's 51,200 vocabulary.
- megatron-1t: Narayanan et al. 2021 (arXiv 2104.04473) Table 1, the 1T row: 128 layers,
  hidden 25600, 160 heads, seq 2048, vocabulary 51,200.
- mt-nlg-530b: Smith et al. 2022 (arXiv 2201.11990): 105 layers, hidden 20480, 128 heads,
  seq 2048.
- llama3-8b / llama3-70b / llama3-405b: Llama 3 (arXiv 2407.21783) Table 3: SwiGLU, 8 key/value
  heads, vocabulary 128,256, rotary positions, untied embeddings; seq 8192.
- mixtral-8x7b: Mistral's released config: 32 x 4096, SwiGLU 14336, 8 experts, top-2.
- llama2-7b / llama2-70b: Llama 2 (arXiv 2307.09288) and its released configs: SwiGLU 11008 /
  28672, vocabulary 32,000, seq 4096; 70B with 8 key/value heads.
- mistral-7b: Mistral 7B (arXiv 2310.06825): 32 x 4096, 8 key/value heads, SwiGLU 14336.
- bloom-176b: BLOOM (arXiv 2211.05100): 70 layers, hidden 14336, 112 heads, vocabulary
  250,880, ALiBi positions (no parameters), tied embeddings, GeLU MLP.
Their parameter counts against the published ones: tests/unit/test_plan.py (within 0.02%).

Each preset also says how it was trained (`TRAINING`): the GPT-era models (2020-2022) with
dropout and the attention scores stored, as Korthikanti 2022 counts them; Llama 3 and Mixtral
with flash attention and no dropout.
"""

from __future__ import annotations

from diag.plan.job import Job, Training
from simulator.config import ModelSpec


def _gpt(layers: int, hidden: int, heads: int) -> ModelSpec:
    """A GPT-3-style model: 4h MLP, multi-head attention, learned positions, tied embeddings."""
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, vocab=51200, seq_len=2048)


def _llama(
    layers: int,
    hidden: int,
    heads: int,
    ffn_hidden: int,
    vocab: int = 128256,
    seq_len: int = 8192,
    kv_heads: int | None = 8,
) -> ModelSpec:
    """A Llama-style model: SwiGLU, grouped-query attention, rotary positions, untied
    embeddings (Llama 3's vocabulary and sequence by default)."""
    return ModelSpec(
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn_hidden=ffn_hidden,
        vocab=vocab,
        seq_len=seq_len,
        kv_heads=kv_heads,
        gated_mlp=True,
        tied_embeddings=False,
        learned_positions=False,
    )


PRESETS: dict[str, ModelSpec] = {
    "gpt3-175b": _gpt(96, 12288, 96),
    "megatron-1t": _gpt(128, 25600, 160),
    "mt-nlg-530b": _gpt(105, 20480, 128),
    "llama3-8b": _llama(32, 4096, 32, 14336),
    "llama3-70b": _llama(80, 8192, 64, 28672),
    "llama3-405b": _llama(126, 16384, 128, 53248),
    "llama2-7b": _llama(32, 4096, 32, 11008, vocab=32000, seq_len=4096, kv_heads=None),
    "llama2-70b": _llama(80, 8192, 64, 28672, vocab=32000, seq_len=4096),
    "mistral-7b": _llama(32, 4096, 32, 14336, vocab=32000, seq_len=8192),
    "bloom-176b": ModelSpec(
        layers=70, hidden=14336, heads=112, vocab=250880, seq_len=2048, learned_positions=False
    ),
    "mixtral-8x7b": ModelSpec(
        layers=32,
        hidden=4096,
        heads=32,
        ffn_hidden=14336,
        vocab=32000,
        seq_len=4096,
        kv_heads=8,
        gated_mlp=True,
        tied_embeddings=False,
        learned_positions=False,
        experts=8,
        topk=2,
    ),
}
"""Preset name -> the model (micro_batch 1; the command line sets the batch)."""


def preset(name: str) -> ModelSpec:
    """The preset called `name`; KeyError naming the choices."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(PRESETS)}") from None


GPT_ERA = Training(flash_attention=False, dropout=True)
MODERN = Training(flash_attention=True, dropout=False)
TRAINING: dict[str, Training] = {
    "gpt3-175b": GPT_ERA,
    "megatron-1t": GPT_ERA,
    "mt-nlg-530b": GPT_ERA,
    "llama3-8b": MODERN,
    "llama3-70b": MODERN,
    "llama3-405b": MODERN,
    "mixtral-8x7b": MODERN,
    "llama2-7b": MODERN,
    "llama2-70b": MODERN,
    "mistral-7b": MODERN,
    "bloom-176b": Training(flash_attention=False, dropout=False),  # Megatron-DeepSpeed, 2022
}
"""Preset name -> how its blocks were trained (flash attention, dropout)."""


def preset_job(name: str, global_batch: int, micro_batch: int = 1) -> Job:
    """The job of preset `name` trained as its paper trained it."""
    return Job(preset(name), global_batch, micro_batch, training=TRAINING[name.lower()])
