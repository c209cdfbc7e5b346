"""Decoder-only language model with an explicit, functional KV cache.

forward(input_ids, attention_mask, position_ids, past) -> (logits, present): past goes in,
present comes out, and a zero-length past is the prefill. This is exactly the ONNX graph.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import CacheAttention, Rope, causal_mask
from .config import ModelConfig
from .layers import KV, BlockOptions, DecoderLayer
from .positional import RotaryEmbedding, positional_encoding


def default_positions(attention_mask: torch.Tensor, t: int) -> torch.Tensor:
    """Position ids of the last T tokens: count of real tokens before each, 0 for padding."""
    positions = attention_mask.long().cumsum(-1) - 1  # (B, P+T)
    return positions.clamp(min=0)[:, -t:]  # (B, T)


def empty_past(config: ModelConfig, batch: int, dtype=torch.float32, device=None) -> list[KV]:
    """A zero-length cache: the prefill's past (on the model's device)."""
    shape = (batch, config.kv_heads, 0, config.d_k)  # (B, H_kv, 0, D)
    zeros = lambda: torch.zeros(shape, dtype=dtype, device=device)
    return [(zeros(), zeros()) for _ in range(config.n_layers)]


class TokenEmbedding(nn.Module):
    """Token embedding scaled by sqrt(d_model) (unless config.embed_scale is off), plus positional
    encoding; its weight is the output head (plus a logits bias where config.logits_bias says)."""

    logits_bias: torch.Tensor | None  # (V,), a buffer saved with the weights (Marian's final_logits_bias)

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        nn.init.normal_(self.embed.weight, std=config.d_model**-0.5)
        self.position = positional_encoding(config.positional, config.max_len, config.d_model, config.sinusoid)
        self.scale = math.sqrt(config.d_model) if config.embed_scale else 1.0
        self.dropout = nn.Dropout(config.dropout)
        self.register_buffer("logits_bias", torch.zeros(config.vocab_size) if config.logits_bias else None)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)  # (B, T, d_model)
        if self.scale != 1.0:
            x = x * self.scale
        if self.position is not None:  # rotary positions turn q and k in attention instead
            x = x + self.position(position_ids)
        return self.dropout(x)

    def logits(self, h: torch.Tensor, head: nn.Module | None = None) -> torch.Tensor:
        """(B, T, V) through the tied embedding, or through `head` (a model's own output layer)."""
        logits = h @ self.embed.weight.t() if head is None else head(h)
        return logits if self.logits_bias is None else logits + self.logits_bias


class DecoderLM(nn.Module):
    """A stack of masked self-attention decoder layers predicting the next token."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embedding = TokenEmbedding(config)
        options = BlockOptions.of(config)
        self.layers = nn.ModuleList(
            DecoderLayer(config.d_model, config.n_heads, config.d_ff, config.dropout, options=options)
            for _ in range(config.n_layers)
        )
        self.ln_f = options.norm_layer(config.d_model)
        rotary = config.positional == "rotary"
        self.rotary = RotaryEmbedding(config.d_k, config.rope_theta, config.rope_scaling) if rotary else None
        self.lm_head = None if config.tie_head else nn.Linear(config.d_model, config.vocab_size, bias=False)

    def rope(self, position_ids: torch.Tensor) -> Rope | None:
        """cos and sin of rotary positions (B, T, D), or None where positions are added to the embeddings."""
        return self.rotary(position_ids) if self.rotary is not None else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past: list[KV] | None = None,
    ):
        """Logits (B, T, V) of the T new tokens, and the present cache (B, H, P+T, D) per layer."""
        b, t = input_ids.shape
        if past is None:
            weight = self.embedding.embed.weight
            past = empty_past(self.config, b, weight.dtype, weight.device)
        if attention_mask is None:
            attention_mask = torch.ones(b, past[0][0].size(2) + t, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = default_positions(attention_mask, t)
        x = self.embedding(input_ids, position_ids)  # (B, T, d_model)
        mask = causal_mask(attention_mask, t, x.dtype)  # (B, 1, T, P+T)
        return self.run_layers(x, mask, past, self.rope(position_ids))

    def run_layers(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        past: list[KV],
        rope: Rope | None = None,
        cache: CacheAttention | None = None,
    ):
        """The decoder stack over embedded tokens: (logits (B, T, V), present per layer); self-attention
        under `mask`, or done by the `cache` strategy (the export's in-place cache)."""
        present = []
        for layer, layer_past in zip(self.layers, past):
            x, kv = layer(x, mask, layer_past, rope=rope, cache=cache)
            present.append(kv)
        h = self.ln_f(x)
        return self.embedding.logits(h, self.lm_head), present

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
