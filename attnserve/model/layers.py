"""Transformer blocks: position-wise feed-forward, encoder layer, decoder layer.

Residual connections around each sub-layer with layer norm applied first (pre-LN, as in
GPT-2 and nanoGPT; it trains without a warm-up crutch at these sizes). Shapes as in
attention.py.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import MultiHeadAttention

KV = tuple[torch.Tensor, torch.Tensor]


ACTIVATION = {  # config.activation -> the function
    "relu": torch.relu,
    "gelu": nn.functional.gelu,
    "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    """FFN(x) = W2 relu(W1 x + b1) + b2, applied at every position independently (GELU for GPT-2)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.act = ACTIVATION[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.w_2(self.act(self.w_1(x))))


class EncoderLayer(nn.Module):
    """Self-attention over the whole source (padding masked), then feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.self_attn(self.ln_1(x), mask)[0])
        return x + self.ffn(self.ln_2(x))


class DecoderLayer(nn.Module):
    """Masked self-attention with a KV cache, optional cross-attention, then feed-forward."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        cross: bool = False,
        activation: str = "relu",
        eps: float = 1e-5,
    ):
        super().__init__()
        self.ln_1, self.ln_3 = nn.LayerNorm(d_model, eps), nn.LayerNorm(d_model, eps)
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ln_2 = nn.LayerNorm(d_model, eps) if cross else None
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout) if cross else None
        self.ffn = FeedForward(d_model, d_ff, dropout, activation)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        past: KV | None = None,
        cross_kv: KV | None = None,
        cross_mask: torch.Tensor | None = None,
        keep_weights: bool = False,
    ) -> tuple[torch.Tensor, KV]:
        attn, present = self.self_attn(self.ln_1(x), mask, past)
        x = x + self.dropout(attn)
        if self.cross_attn is not None:
            assert cross_kv is not None and self.ln_2 is not None, "cross-attention needs the source's keys, values"
            x = x + self.dropout(self.cross_attn.attend(self.ln_2(x), *cross_kv, cross_mask, keep_weights))
        return x + self.ffn(self.ln_3(x)), present
