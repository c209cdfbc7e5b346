"""Scaled dot-product attention, its masks, and multi-head attention (self and cross).

Written out from the lectures (softmax(QK^T / sqrt(d_k) + M) V), not taken from
nn.MultiheadAttention. Shapes: B batch, T new tokens, P past length, S keys (P + T or the
source length), H heads, D head dim (d_k).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
):
    """softmax(q k^T / sqrt(d_k) + mask) v; returns (output, attention weights).

    q: (..., T, D), k and v: (..., S, D), mask: additive, broadcastable to (..., T, S),
    holding 0 where attention is allowed and -inf where it is not.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T, S)
    if mask is not None:
        scores = scores + mask
    weights = scores.softmax(dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `allowed` is true, -inf elsewhere."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.tensor(float("-inf"), dtype=dtype))


def padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, S) of 1 = real, 0 = padding  ->  additive (B, 1, 1, S): no query looks at padding."""
    return additive_mask(attention_mask[:, None, None, :].bool(), dtype)


def causal_mask(attention_mask: torch.Tensor, t: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive (B, 1, T, P + T) mask for T new tokens after P cached ones.

    Query i (absolute position P + i) sees key j when j <= P + i and key j is real. A padding
    query also sees itself, so that no row is all -inf (its output is never used).
    """
    s = attention_mask.size(1)  # P + T
    key = torch.arange(s, device=attention_mask.device)
    query = key[s - t :]  # absolute positions of new tokens
    not_future = key[None, :] <= query[:, None]  # (T, S)
    itself = key[None, :] == query[:, None]  # (T, S)
    real = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S)
    return additive_mask((not_future & real) | itself, dtype)  # (B, 1, T, S)


class CacheAttention:
    """Self-attention computed by something other than the plain concat-cache path: given the
    module, x and the layer's past, returns (output, present). Export supplies one (ONNX Runtime's
    GroupQueryAttention over an in-place cache); training and the eager reference never do."""

    def __call__(self, attention: MultiHeadAttention, x: torch.Tensor, past):
        raise NotImplementedError


class MultiHeadAttention(nn.Module):
    """Multi-head attention: H heads of scaled dot-product attention, concatenated, projected.

    Self-attention takes its keys and values from x and appends them to the cache `past`;
    cross-attention takes precomputed keys and values (see `project_kv`).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.last_weights: torch.Tensor | None = None  # (B, H, T, S), kept only when asked

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, D)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.n_heads * self.d_k)  # (B, T, H*D)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of x, (B, H, S, D) each."""
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))

    def attend(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, keep_weights: bool = False
    ) -> torch.Tensor:
        q = self.split_heads(self.w_q(x))  # (B, H, T, D)
        out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout)
        self.last_weights = weights.detach() if keep_weights else None
        return self.w_o(self.merge_heads(out))  # (B, T, d_model)

    def forward(self, x: torch.Tensor, mask, past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Self-attention over past + x; returns (output, present) with present (B, H, P+T, D).

        `mask` is the additive mask, or a CacheAttention that does the attention itself (the
        export's in-place cache, where past and present are one buffer)."""
        if isinstance(mask, CacheAttention):
            return mask(self, x, past)
        k, v = self.project_kv(x)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        return self.attend(x, k, v, mask), (k, v)
