"""Positional encodings: sinusoidal (Vaswani et al., the default) or learned.

Both are looked up by explicit position ids, so that left-padded sequences and cached
decoding place every token where it really is.
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


def positional_encoding(kind: str, max_len: int, d_model: int) -> nn.Module:
    return (SinusoidalPositionalEncoding if kind == "sinusoidal" else LearnedPositionalEncoding)(max_len, d_model)
