"""Scaled dot-product attention, its masks, and multi-head attention (self and cross).

Written out from the lectures (softmax(QK^T / sqrt(d_k) + M) V), not taken from
nn.MultiheadAttention. Shapes: B batch, T new tokens, P past length, S keys (P + T or the
source length), H heads, D head dim (d_k).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .positional import apply_rotary


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


Rope = tuple[torch.Tensor, torch.Tensor]  # cos and sin of rotary positions, (B, T, D) each


class CacheAttention:
    """Self-attention computed by something other than the plain concat-cache path: given the
    module, x, the layer's past and rotary positions (if any), returns (output, present). Export
    supplies one (ONNX Runtime's GroupQueryAttention over an in-place cache); training and the eager
    reference never do."""

    def __call__(self, attention: MultiHeadAttention, x: torch.Tensor, past, rope: Rope | None = None):
        raise NotImplementedError


def repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """(B, H_kv, S, D) -> (B, H_kv * times, S, D): each key/value head serves `times` query heads."""
    return x if times == 1 else x.repeat_interleave(times, dim=1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: H heads of scaled dot-product attention, concatenated, projected.

    Self-attention takes its keys and values from x and appends them to the cache `past`;
    cross-attention takes precomputed keys and values (see `project_kv`). With n_kv_heads < n_heads
    (grouped-query attention) each key/value head serves n_heads / n_kv_heads query heads, and the
    cache holds the n_kv_heads only; rotary positions, when given, turn q and k before attention.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        n_kv_heads: int | None = None,
        qkv_bias: bool = True,
        o_bias: bool = True,
    ):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.w_k = nn.Linear(d_model, self.n_kv_heads * self.d_k, bias=qkv_bias)
        self.w_v = nn.Linear(d_model, self.n_kv_heads * self.d_k, bias=qkv_bias)
        self.w_o = nn.Linear(d_model, d_model, bias=o_bias)
        self.dropout = nn.Dropout(dropout)
        self.last_weights: torch.Tensor | None = None  # (B, H, T, S), kept only when asked

    def split_heads(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads or self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, D)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.n_heads * self.d_k)  # (B, T, H*D)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of x, (B, H_kv, S, D) each."""
        return self.split_heads(self.w_k(x), self.n_kv_heads), self.split_heads(self.w_v(x), self.n_kv_heads)

    def project(self, x: torch.Tensor, rope: Rope | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, D) and k, v (B, H_kv, T, D) of x, q and k turned by rotary positions if given."""
        q = self.split_heads(self.w_q(x))
        k, v = self.project_kv(x)
        if rope is not None:
            q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        return q, k, v

    def attend_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, keep_weights: bool = False
    ) -> torch.Tensor:
        """Attention of split queries (B, H, T, D) over keys and values (B, H_kv, S, D), projected."""
        groups = self.n_heads // self.n_kv_heads
        out, weights = scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), mask, self.dropout)
        self.last_weights = weights.detach() if keep_weights else None
        return self.w_o(self.merge_heads(out))  # (B, T, d_model)

    def attend(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, keep_weights: bool = False
    ) -> torch.Tensor:
        return self.attend_heads(self.split_heads(self.w_q(x)), k, v, mask, keep_weights)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        rope=None,
        cache: CacheAttention | None = None,
    ):
        """Self-attention over past + x under the additive `mask`; returns (output, present) with present
        (B, H_kv, P+T, D). A `cache` strategy does the attention itself instead (the export's in-place
        cache, where past and present are one buffer and the mask is its own)."""
        if cache is not None:
            return cache(self, x, past, rope)
        q, k, v = self.project(x, rope)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        return self.attend_heads(q, k, v, mask), (k, v)
