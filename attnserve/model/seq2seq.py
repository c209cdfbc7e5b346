"""Encoder-decoder Transformer (Vaswani et al.): encoder self-attention, decoder masked
self-attention with a KV cache, and cross-attention to the encoder output.

The cross-attention keys and values are computed once per source (`cross_kv`) and passed to
every decode step, as the ONNX decoder graph takes them.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from .attention import CacheAttention, causal_mask, padding_mask
from .config import ModelConfig
from .layers import KV, BlockOptions, DecoderLayer, EncoderLayer
from .lm import TokenEmbedding, default_positions, empty_past


class EncoderDecoder(nn.Module):
    """Source bytes in, target bytes out; embeddings shared between source, target and output."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embedding = TokenEmbedding(config)
        options = BlockOptions.of(config)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(config.d_model, config.n_heads, config.d_ff, config.dropout, options)
            for _ in range(config.n_encoder_layers)
        )
        final_norm = lambda: nn.Identity() if options.post else options.norm_layer(config.d_model)  # post-LN: none
        self.ln_enc = final_norm()
        self.layers = nn.ModuleList(
            DecoderLayer(config.d_model, config.n_heads, config.d_ff, config.dropout, cross=True, options=options)
            for _ in range(config.n_layers)
        )
        self.ln_f = final_norm()
        self.lm_head = None if config.tie_head else nn.Linear(config.d_model, config.vocab_size, bias=False)

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Encoder output (B, S, d_model) of a padded source batch."""
        x = self.embedding(src_ids, default_positions(src_mask, src_ids.size(1)))
        mask = padding_mask(src_mask, x.dtype)  # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.ln_enc(x)

    def cross_kv(self, memory: torch.Tensor) -> list[KV]:
        """Cross-attention keys and values of the encoder output, (B, H, S, D) per layer."""
        kv = []
        for layer in cast("list[DecoderLayer]", self.layers):
            assert layer.cross_attn is not None  # every decoder layer here is built with cross=True
            kv.append(layer.cross_attn.project_kv(memory))
        return kv

    def decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        src_mask: torch.Tensor,
        cross: list[KV],
        past: list[KV] | None = None,
        keep_weights: bool = False,
    ):
        """Logits (B, T, V) of the new target tokens and the present self-attention cache."""
        b, t = input_ids.shape
        if past is None:
            weight = self.embedding.embed.weight
            past = empty_past(self.config, b, weight.dtype, weight.device)
        if attention_mask is None:
            attention_mask = torch.ones(b, past[0][0].size(2) + t, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = default_positions(attention_mask, t)
        x = self.embedding(input_ids, position_ids)
        mask = causal_mask(attention_mask, t, x.dtype)  # (B, 1, T, P+T)
        return self.run_layers(x, mask, past, cross, src_mask, keep_weights)

    def run_layers(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        past: list[KV],
        cross: list[KV],
        src_mask: torch.Tensor,
        keep_weights: bool = False,
        cache: CacheAttention | None = None,
    ):
        """The decoder stack over embedded target tokens: (logits (B, T, V), present self-attention cache);
        self-attention under `mask`, or done by the `cache` strategy (the export's in-place cache)."""
        cross_mask = padding_mask(src_mask, x.dtype)  # (B, 1, 1, S)
        present = []
        for layer, layer_past, kv in zip(self.layers, past, cross):
            x, layer_present = layer(x, mask, layer_past, kv, cross_mask, keep_weights, cache=cache)
            present.append(layer_present)
        return self.embedding.logits(self.ln_f(x), self.lm_head), present

    def forward(
        self, src_ids: torch.Tensor, src_mask: torch.Tensor, tgt_ids: torch.Tensor, tgt_mask: torch.Tensor | None = None
    ):
        """Teacher-forced logits (B, T, V) for the whole target."""
        cross = self.cross_kv(self.encode(src_ids, src_mask))
        return self.decode(tgt_ids, tgt_mask, None, src_mask, cross)[0]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
