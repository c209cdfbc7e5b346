"""Transformer blocks: position-wise feed-forward, encoder layer, decoder layer.

Residual connections around each sub-layer with layer norm applied first (pre-LN, as in
GPT-2 and nanoGPT; it trains without a warm-up crutch at these sizes), or after the residual
sum (post-LN, as Vaswani et al. and Marian: an imported model's). Shapes as in attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .attention import CacheAttention, MultiHeadAttention, Rope
from .config import ModelConfig

KV = tuple[torch.Tensor, torch.Tensor]


ACTIVATION = {  # config.activation -> the function (SwiGLU's gate is FeedForward's own)
    "relu": torch.relu,
    "gelu": nn.functional.gelu,
    "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "swiglu": nn.functional.silu,
    "silu": nn.functional.silu,
}


@dataclass(frozen=True)
class BlockOptions:
    """What a block may differ in from the lectures' (the defaults), for imported models."""

    activation: str = "relu"  # relu, gelu, gelu_tanh or swiglu
    norm: str = "layernorm"  # or rmsnorm
    eps: float = 1e-5  # the norms' epsilon
    n_kv_heads: int | None = None  # key/value heads (None: as many as query heads)
    qkv_bias: bool = True
    o_bias: bool = True
    ffn_bias: bool = True
    norm_position: str = "pre"  # or post: norm(x + f(x))

    @classmethod
    def of(cls, config: ModelConfig) -> BlockOptions:
        return cls(
            config.activation,
            config.norm,
            config.norm_eps,
            config.kv_heads,
            config.qkv_bias,
            config.o_bias,
            config.ffn_bias,
            config.norm_position,
        )

    def norm_layer(self, d_model: int) -> nn.Module:
        return nn.LayerNorm(d_model, self.eps) if self.norm == "layernorm" else nn.RMSNorm(d_model, eps=self.eps)

    @property
    def post(self) -> bool:
        return self.norm_position == "post"


class Residuals(nn.Module):
    """Where a block's norms sit around its residual sums: x + f(norm(x)) (pre-LN) or norm(x + f(x))
    (post-LN). A sub-layer reads `into(norm, x)` and the block goes on with `out(norm, x + f(...))`."""

    post: bool = False

    def into(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x if self.post else norm(x)

    def out(self, norm: nn.Module, summed: torch.Tensor) -> torch.Tensor:
        return norm(summed) if self.post else summed


class FeedForward(nn.Module):
    """FFN(x) = W2 relu(W1 x + b1) + b2, applied at every position independently (GELU for GPT-2;
    SwiGLU for Llama: W2 (silu(W1 x) * W3 x))."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, options: BlockOptions = BlockOptions()):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff, bias=options.ffn_bias)
        self.w_2 = nn.Linear(d_ff, d_model, bias=options.ffn_bias)
        self.w_3 = nn.Linear(d_model, d_ff, bias=options.ffn_bias) if options.activation == "swiglu" else None
        self.act = ACTIVATION[options.activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.act(self.w_1(x))
        if self.w_3 is not None:
            hidden = hidden * self.w_3(x)
        return self.dropout(self.w_2(hidden))


class EncoderLayer(Residuals):
    """Self-attention over the whole source (padding masked), then feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, options=BlockOptions()):
        super().__init__()
        self.ln_1, self.ln_2 = options.norm_layer(d_model), options.norm_layer(d_model)
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout, options)
        self.dropout = nn.Dropout(dropout)
        self.post = options.post

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.out(self.ln_1, x + self.dropout(self.self_attn(self.into(self.ln_1, x), mask)[0]))
        return self.out(self.ln_2, x + self.ffn(self.into(self.ln_2, x)))


class DecoderLayer(Residuals):
    """Masked self-attention with a KV cache, optional cross-attention, then feed-forward."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        cross: bool = False,
        options: BlockOptions = BlockOptions(),
    ):
        super().__init__()
        self.ln_1, self.ln_3 = options.norm_layer(d_model), options.norm_layer(d_model)
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout, options.n_kv_heads, options.qkv_bias, options.o_bias
        )
        self.ln_2 = options.norm_layer(d_model) if cross else None
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout) if cross else None
        self.ffn = FeedForward(d_model, d_ff, dropout, options)
        self.dropout = nn.Dropout(dropout)
        self.post = options.post

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        past: KV | None = None,
        cross_kv: KV | None = None,
        cross_mask: torch.Tensor | None = None,
        keep_weights: bool = False,
        rope: Rope | None = None,
        cache: CacheAttention | None = None,
    ) -> tuple[torch.Tensor, KV]:
        """One decoder layer; its self-attention under `mask`, or done by the `cache` strategy (export's)."""
        attn, present = self.self_attn(self.into(self.ln_1, x), mask, past, rope, cache)
        x = self.out(self.ln_1, x + self.dropout(attn))
        if self.cross_attn is not None:
            assert cross_kv is not None and self.ln_2 is not None, "cross-attention needs the source's keys, values"
            attn = self.cross_attn.attend(self.into(self.ln_2, x), *cross_kv, cross_mask, keep_weights)
            x = self.out(self.ln_2, x + self.dropout(attn))
        return self.out(self.ln_3, x + self.ffn(self.into(self.ln_3, x))), present
