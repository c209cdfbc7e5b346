"""ONNX Runtime's GroupQueryAttention over an in-place KV cache, as a CacheAttention for export.

Past and present are one buffer per layer, (B, H_kv, L, D) with L the context: each run writes the
new keys and values of row b at positions [seqlens_k[b] - T + 1, seqlens_k[b]] and reads only
[0, seqlens_k[b]] (docs/guides/export.md). A first prompt (T == total_sequence_length) is
written at [0, T), right-padded. Inside torch.onnx.export the kernel is the contrib op itself;
in eager PyTorch it is a functional reference of the op's semantics, so the arena graph can be
run and tested without ONNX Runtime. Knows nothing of serving.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..model.attention import (
    CacheAttention,
    MultiHeadAttention,
    Rope,
    additive_mask,
    repeat_kv,
    scaled_dot_product_attention,
)
from ..model.positional import RotaryEmbedding, apply_rotary

OP = "com.microsoft::GroupQueryAttention"


def lengths_from_mask(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """seqlens_k (B,) int32 = real tokens - 1 per row, and total_sequence_length (int32 scalar) =
    the mask's width, derived in the graph as onnxruntime-genai's model builder does."""
    seqlens_k = (attention_mask.sum(1) - 1).to(torch.int32)
    total = torch.tensor(attention_mask.shape[1], dtype=torch.int32)
    return seqlens_k, total


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_key: torch.Tensor,
    past_value: torch.Tensor,
    seqlens_k: torch.Tensor,
    total: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
):
    """What GroupQueryAttention computes, in plain PyTorch.

    q: (B, T, H*D), k, v: (B, T, H_kv*D); past_key/value: (B, H_kv, L, D); returns (output (B, T, H*D),
    present_key, present_value), present being past with the new rows written in place."""
    b, t, _ = q.shape
    length = past_key.size(2)
    split = lambda x, heads: x.view(b, t, heads, -1).transpose(1, 2)
    first_prompt = t == int(total)
    start = torch.zeros_like(seqlens_k) if first_prompt else seqlens_k + 1 - t  # (B,) past length
    where = (start[:, None] + torch.arange(t)).long()  # (B, T) positions
    if int(where.max()) >= length:
        raise ValueError(f"the cache holds {length} positions; row needs {int(where.max()) + 1}")
    index = where[:, None, :, None].expand(b, n_kv_heads, t, past_key.size(3))
    present_key = past_key.scatter(2, index, split(k, n_kv_heads))
    present_value = past_value.scatter(2, index, split(v, n_kv_heads))
    key = torch.arange(length)
    allowed = (key[None, None, :] <= where[:, :, None]) & (key[None, None, :] <= seqlens_k[:, None, None].long())
    mask = additive_mask(allowed[:, None], q.dtype)  # (B, 1, T, L)
    groups = n_heads // n_kv_heads
    keys, values = repeat_kv(present_key, groups), repeat_kv(present_value, groups)
    out, _ = scaled_dot_product_attention(split(q, n_heads), keys, values, mask)
    return out.transpose(1, 2).reshape(b, t, -1), present_key, present_value


class RotaryTables(NamedTuple):
    """Rotary positions as GroupQueryAttention turns q and k itself (do_rotary): cos and sin of every
    position's angles (context, D/2) and the run's position ids (B, T)."""

    cos: torch.Tensor
    sin: torch.Tensor
    position_ids: torch.Tensor

    @classmethod
    def of(cls, rotary: RotaryEmbedding, context: int, position_ids: torch.Tensor, dtype: torch.dtype):
        angles = torch.arange(context, dtype=torch.float32)[:, None] * rotary.inv_freq  # (context, D/2)
        return cls(angles.cos().to(dtype), angles.sin().to(dtype), position_ids)

    def rope(self) -> Rope:
        """The same positions as (cos, sin) (B, T, D), the layout apply_rotary takes."""
        cos, sin = self.cos[self.position_ids], self.sin[self.position_ids]  # (B, T, D/2)
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def group_query_attention(
    q, k, v, past_key, past_value, seqlens_k, total, n_heads: int, n_kv_heads: int, rotary: RotaryTables | None = None
):
    """The contrib op under torch.onnx.export, the reference elsewhere; with `rotary` the op turns
    q and k itself."""
    if not torch.onnx.is_in_onnx_export():
        if rotary is not None:
            b, t, _ = q.shape
            q, k = (turned(x.view(b, t, -1, rotary.cos.size(1) * 2), rotary.rope()) for x in (q, k))
        return reference(q, k, v, past_key, past_value, seqlens_k, total, n_heads, n_kv_heads)
    extra = [] if rotary is None else [rotary.cos, rotary.sin, rotary.position_ids]
    return torch.onnx.ops.symbolic_multi_out(
        OP,
        [q, k, v, past_key, past_value, seqlens_k, total, *extra],
        dict(num_heads=n_heads, kv_num_heads=n_kv_heads, do_rotary=int(rotary is not None)),
        dtypes=[q.dtype, past_key.dtype, past_value.dtype],
        shapes=[q.shape, past_key.shape, past_value.shape],
        version=1,
    )


class InPlaceAttention(CacheAttention):
    """Self-attention of one decoder layer through GroupQueryAttention, sharing the lengths of the
    batch (derived once from the attention mask). Rotary positions are turned inside the op when
    `rotary` tables are given, else (a `rope` from the layers) as separate nodes before it."""

    def __init__(self, attention_mask: torch.Tensor, rotary: RotaryTables | None = None):
        self.seqlens_k, self.total = lengths_from_mask(attention_mask)
        self.rotary = rotary

    def __call__(self, attention: MultiHeadAttention, x: torch.Tensor, past, rope: Rope | None = None):
        q, k, v = attention.w_q(x), attention.w_k(x), attention.w_v(x)  # (B, T, H*D), (B, T, H_kv*D)
        if rope is not None and self.rotary is None:
            b, t, _ = x.shape
            q, k = (turned(each.view(b, t, -1, attention.d_k), rope) for each in (q, k))
        out, present_key, present_value = group_query_attention(
            q, k, v, past[0], past[1], self.seqlens_k, self.total, attention.n_heads, attention.n_kv_heads, self.rotary
        )
        return attention.w_o(out), (present_key, present_value)


def turned(heads: torch.Tensor, rope: Rope) -> torch.Tensor:
    """(B, T, heads, D) turned by rotary positions, back in the op's layout (B, T, heads*D)."""
    b, t = heads.shape[:2]
    return apply_rotary(heads.transpose(1, 2), rope).transpose(1, 2).reshape(b, t, -1)
