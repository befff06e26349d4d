"""A tiny GPT, readable in one sitting (after nanoGPT, github.com/karpathy/nanoGPT).

Token + positional embedding, `layers` pre-LayerNorm blocks of causal multi-head self-attention
and a GELU MLP, a final LayerNorm, and an LM head tied to the token embedding. `Block`,
`CausalSelfAttention` and `MLP` stay separate small classes because the reference trainers split
`GPT.blocks` into pipeline stages, shard it with FSDP2, shard attention heads and MLP columns for
TP, or swap the MLP for a mixture of experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_KINDS = ("sdpa", "naive")


@dataclass
class GPTConfig:
    layers: int = 2  # number of transformer blocks
    hidden: int = 128  # model width (embedding size)
    heads: int = 4  # attention heads; must divide hidden
    seq_len: int = 64  # maximum sequence length (positional embedding size)
    vocab: int = 512  # vocabulary size
    ffn_hidden: int | None = None  # MLP inner width; None means 4 * hidden
    dropout: float = 0.0  # dropout probability (0 keeps runs deterministic)
    attention: str = "sdpa"  # "sdpa" (fused, no seq x seq tensor kept) or "naive" (keeps it)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads != 0:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.ffn_hidden is None:
            self.ffn_hidden = 4 * self.hidden
        elif self.ffn_hidden < 1:
            raise ValueError(f"GPTConfig.ffn_hidden must be >= 1, got {self.ffn_hidden}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"GPTConfig.attention must be one of {ATTENTION_KINDS}, got {self.attention!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str = "sdpa", dropout_p: float = 0.0
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + causal mask) V over (batch, heads, seq, head_dim) tensors.

    "sdpa" is `F.scaled_dot_product_attention`: its fused kernels keep no seq x seq tensor for
    backward. "naive" spells the product out, as the activation formula of Korthikanti et al.
    (arXiv 2205.05198, s*b*h*(34 + 5*a*s/h)) assumes: the softmax output, heads x seq x seq per
    sequence, is saved for backward, so activations grow with seq squared.
    """
    if kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    seq = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    weights = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return F.dropout(weights, p=dropout_p, training=dropout_p > 0) @ v


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask (fused QKV projection, then output proj)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)
        self.dropout = config.dropout
        self.kind = config.attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).split(self.heads * self.head_dim, dim=-1)
        # (batch, seq, heads*head_dim) -> (batch, heads, seq, head_dim)
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v, self.kind, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(batch, seq, -1)
        return F.dropout(self.proj(y), p=self.dropout, training=self.training)


class MLP(nn.Module):
    """Linear -> GELU -> Linear (the `Y = GeLU(X A) B` of Megatron, arXiv 1909.08053)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.ffn_hidden is not None  # filled in by GPTConfig.__post_init__
        self.fc = nn.Linear(config.hidden, config.ffn_hidden)
        self.proj = nn.Linear(config.ffn_hidden, config.hidden)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(F.gelu(self.fc(x)))
        return F.dropout(y, p=self.dropout, training=self.training)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.hidden)
        self.attn = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.hidden)
        self.mlp: nn.Module = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab, config.hidden)
        self.pos_emb = nn.Embedding(config.seq_len, config.hidden)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.hidden)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying (Press & Wolf, arXiv 1608.05859)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(batch, seq) token ids -> (logits (batch, seq, vocab), mean cross-entropy or None)."""
        seq = idx.shape[1]
        if seq > self.config.seq_len:
            raise ValueError(f"sequence length {seq} exceeds seq_len {self.config.seq_len}")
        pos = torch.arange(seq, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def count_params(model: nn.Module) -> int:
    """Number of unique parameters (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())
