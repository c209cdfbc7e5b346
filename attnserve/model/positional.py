"""Positional encodings: sinusoidal (Vaswani et al., the default), learned (GPT-2), both added to the
token embeddings, or rotary (RoFormer; Llama), which turns each query and key head instead.

All are looked up by explicit position ids, so that left-padded sequences and cached decoding place
every token where it really is.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(max_len: int, d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """(max_len, d_model): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)); the
    "halves" layout (Marian's) holds the same values as PE[p, i] = sin(...), PE[p, d/2 + i] = cos(...)."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = position / torch.pow(10000.0, two_i / d_model)
    if layout == "halves":
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).float()
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encodings, added to the token embeddings."""

    table: torch.Tensor  # (max_len, d_model), a buffer: moves with the module, not saved

    def __init__(self, max_len: int, d_model: int, layout: str = "interleaved"):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, d_model, layout), persistent=False)

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


def positional_encoding(kind: str, max_len: int, d_model: int, sinusoid: str = "interleaved") -> nn.Module | None:
    """The table added to the token embeddings; None for rotary positions, which add nothing."""
    if kind == "rotary":
        return None
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(max_len, d_model, sinusoid)
    return LearnedPositionalEncoding(max_len, d_model)


ROPE_SCALINGS = ("linear", "llama3")  # rope_scaling["rope_type"]: position interpolation, Llama 3.1's


def scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """The frequencies under a rotary scaling: "linear" divides them all by the factor; "llama3" divides
    the low ones (wavelength above original context / low_freq_factor), keeps the high ones (below
    original context / high_freq_factor) and blends in between, as Llama 3.1 was trained."""
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    divided = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * divided / factor + smooth * divided
    medium = ~(wavelength < context / high) & ~(wavelength > context / low)
    return torch.where(medium, blended, divided)


class RotaryEmbedding(nn.Module):
    """cos and sin of each position's angles, (B, T, D) for head dim D: angle p * theta^(-2i/D), the
    D/2 frequencies written twice (the rotate-half layout Hugging Face's Llama uses), scaled where the
    model was trained with a rotary scaling."""

    inv_freq: torch.Tensor  # (D/2,), a buffer: moves with the module, not saved

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (theta**exponents)
        self.register_buffer("inv_freq", scaled(inv_freq, scaling) if scaling else inv_freq, persistent=False)

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
