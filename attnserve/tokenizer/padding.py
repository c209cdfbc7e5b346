"""A batch of token sequences left-padded to one length: how the concat layout's batch and the PyTorch
reference decode take their prompts. Plain lists, so that torch (model/generate.py) and numpy
(runtime/ort_session.py) each make their tensors of the same padding.
"""

from __future__ import annotations

from collections.abc import Sequence

Rows = list[list[int]]


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[Rows, Rows, Rows]:
    """input_ids, attention_mask (1 = real) and position_ids (0 on padding), each one row per sequence
    as long as the longest."""
    t = max(len(s) for s in seqs)
    ids = [[pad_id] * (t - len(s)) + list(s) for s in seqs]
    mask = [[0] * (t - len(s)) + [1] * len(s) for s in seqs]
    positions = [[0] * (t - len(s)) + list(range(len(s))) for s in seqs]
    return ids, mask, positions
