"""Positional encodings: sinusoidal (Vaswani et al., the default), learned (GPT-2), both added to the
token embeddings, or rotary (RoFormer; Llama), which turns each query and key head instead.

All are looked up by explicit position ids, so that left-padded sequences and cached decoding place
every token where it really is.
"""

from __future__ import annotations

import torch
from torch import nn


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, d_model): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = position / torch.pow(10000.0, two_i / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encodings, added to the token embeddings."""

    table: torch.Tensor  # (max_len, d_model), a buffer: moves with the module, not saved

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]  # (B, T, d_model)


class LearnedPositionalEncoding(nn.Module):
    """One trained vector per position."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table(position_ids)  # (B, T, d_model)


def positional_encoding(kind: str, max_len: int, d_model: int) -> nn.Module | None:
    """The table added to the token embeddings; None for rotary positions, which add nothing."""
    if kind == "rotary":
        return None
    return (SinusoidalPositionalEncoding if kind == "sinusoidal" else LearnedPositionalEncoding)(max_len, d_model)


class RotaryEmbedding(nn.Module):
    """cos and sin of each position's angles, (B, T, D) for head dim D: angle p * theta^(-2i/D), the
    D/2 frequencies written twice (the rotate-half layout Hugging Face's Llama uses)."""

    inv_freq: torch.Tensor  # (D/2,), a buffer: moves with the module, not saved

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.register_buffer("inv_freq", 1.0 / (theta**exponents), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids[..., None].float() * self.inv_freq  # (B, T, D/2)
        both = torch.cat([angles, angles], dim=-1)  # (B, T, D)
        return both.cos(), both.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x (B, H, T, D) turned by each position's angles (cos, sin: (B, T, D))."""
    cos, sin = (t[:, None].to(x.dtype) for t in rope)  # (B, 1, T, D)
    return x * cos + rotate_half(x) * sin
