"""The lectures' worked examples: dot-product scores, attention output, permutation
equivariance, sinusoidal encoding, causal masking."""

import math

import pytest
import torch

from attnserve.model.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from attnserve.model.positional import SinusoidalPositionalEncoding, sinusoidal_table

QUERY = torch.tensor([[10.0, 5.0, 10.0]])
KEYS = torch.tensor([[0.0, 1.0, 1.0], [5.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, 5.0, 1.0]])


def test_worked_example_scores():
    """decoder_hidden [10,5,10] against the four encoder states: 15, 60, 15, 35."""
    assert (QUERY @ KEYS.T).tolist() == [[15.0, 60.0, 15.0, 35.0]]


def test_worked_example_attention_output_matches_hand_computation():
    values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]])
    out, weights = scaled_dot_product_attention(QUERY, KEYS, values)
    scores = [15 / math.sqrt(3), 60 / math.sqrt(3), 15 / math.sqrt(3), 35 / math.sqrt(3)]
    z = sum(math.exp(s) for s in scores)
    alpha = [math.exp(s) / z for s in scores]
    expected = [sum(a * v[j] for a, v in zip(alpha, values.tolist())) for j in range(2)]
    assert weights[0].tolist() == pytest.approx(alpha, rel=1e-5)
    assert out[0].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert weights[0].argmax().item() == 1  # key 2 (score 60) dominates


def _self_attention(mha, x, positions=None):
    if positions is not None:
        x = x + positions
    return mha(x, mask=None)[0]


def test_self_attention_without_positions_is_permutation_equivariant():
    """'john loves mary' vs 'mary loves john': same vectors, permuted."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    john, loves, mary = torch.randn(3, 8)
    a = _self_attention(mha, torch.stack([john, loves, mary])[None])
    b = _self_attention(mha, torch.stack([mary, loves, john])[None])
    torch.testing.assert_close(b[0], a[0][[2, 1, 0]])


def test_positional_encoding_breaks_permutation_equivariance():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    john, loves, mary = torch.randn(3, 8)
    pe = sinusoidal_table(3, 8)[None]
    a = _self_attention(mha, torch.stack([john, loves, mary])[None], pe)
    b = _self_attention(mha, torch.stack([mary, loves, john])[None], pe)
    assert (b[0] - a[0][[2, 1, 0]]).abs().max() > 1e-3


@pytest.mark.parametrize("pos", [0, 1, 7, 50, 99])
@pytest.mark.parametrize("i", [0, 1, 4, 15])
def test_sinusoidal_matches_lecture_formula(pos, i):
    d = 16
    table = SinusoidalPositionalEncoding(100, d)(torch.tensor([[pos]]))[0, 0]
    k = i // 2  # p_{j,i} = sin(j / 10000^(i/d)) for even i, cos(j / 10000^((i-1)/d)) for odd i
    angle = pos / 10000 ** (2 * k / d)
    expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    assert table[i].item() == pytest.approx(expected, abs=1e-6)


def test_causal_mask_shape_and_values():
    mask = causal_mask(torch.ones(1, 3, dtype=torch.long), 3, torch.float32)
    assert mask.shape == (1, 1, 3, 3)
    assert torch.isinf(mask[0, 0]).tolist() == [[False, True, True], [False, False, True], [False, False, False]]


def test_causal_mask_hides_padding_but_padding_sees_itself():
    mask = causal_mask(torch.tensor([[0, 1, 1]]), 3, torch.float32)[0, 0]
    assert torch.isinf(mask).tolist() == [[False, True, True], [True, False, True], [True, False, False]]
