"""The host's draw over one row of temperature-scaled logits, in float64: which ids min-p, top-k and top-p
keep, and the inverse-CDF pick among them in id order (sampling.py's Sampler and the batched pass's
oracle, sampling.pick_row). Knows nothing of requests, seeds or the pass.

A flat row of 50,257 ids is the costly case (a random-weight GPT-2's, or a trained model's where it is
unsure): top-p then keeps most of it, so nothing here sorts the row or allocates per draw. Each step is
one pass over the row into buffers kept per thread (the engine's thread and a run-ahead worker may draw
at once): the weights, their sums by buckets of value to find top-p's edge (only the edge's bucket is
sorted), then the kept weights' sums by blocks of BLOCK ids, and one block's running sum for the pick.
Sums may part from a sequential float64 sum in the last bits: a pick may differ from that of a plain
running sum only where the uniform number falls within about 1e-15 of an id's edge.
"""

from __future__ import annotations

import threading

import numpy as np

from . import whole_draw

BUCKETS = 4096  # top-p's buckets of value (for a row of 32,768 ids or more): the edge's bucket alone is sorted
BLOCK = 64  # the draw's first level: the kept weights' sums by blocks of this many ids
FEW = 8  # min-p and top-k keeping at most 1/FEW of a row: the kept ids alone are worked on, top-p by a sort


class Scratch(threading.local):
    """Each thread's buffers for rows of one size (V,): the scaled row (sampling.pick_row's), and draw's:
    shifted values, weights (padded with zeros to whole blocks), bucket numbers, a product and a mask; and
    float32 rows for the compiled draw's copies of banning rows (sampling.banned_copy)."""

    size = -1
    banned = np.empty((0, 0), np.float32)

    def banned_rows(self, n: int, size: int) -> np.ndarray:
        """n float32 rows (n, V), kept from call to call: no new pages a step."""
        if self.banned.shape[0] < n or self.banned.shape[1] != size:
            self.banned = np.empty((n, size), np.float32)
        return self.banned[:n]

    def row(self, size: int) -> np.ndarray:
        """The scaled row's buffer, (V,) float64."""
        self.buffers(size)
        return self.scaled

    def buffers(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if size != self.size:
            padded = -(-size // BLOCK) * BLOCK
            self.size, self.weights = size, np.zeros(padded)  # (V rounded up to BLOCK,), zeros past V
            self.scaled, self.shifted, self.product = np.empty(size), np.empty(size), np.empty(size)
            self.bucket, self.mask = np.empty(size, np.int64), np.empty(size, bool)
        return self.shifted, self.weights, self.bucket, self.product, self.mask


SCRATCH = Scratch()


def kept_weights(scaled: np.ndarray, min_p: float, top_k: int, top_p: float) -> tuple[np.ndarray | None, np.ndarray]:
    """The ids min-p, top-k and top-p keep of a temperature-scaled row (V,), and their weights (exp of their
    value less the row's largest). Where min-p and top-k keep few ids (at most 1/FEW of the row), those ids
    (ascending; the ones top-p drops weigh 0) and their weights; else None and the whole row's weights, 0
    for the ids not kept, padded with zeros to whole blocks (this thread's scratch, valid until its next
    call). In the order of the ids by logit, descending, lower id first on ties, each keeps a prefix: min-p
    the ids at least min_p times as likely as the likeliest (vLLM's and transformers'), top-k those at least
    as likely as the k-th (ties kept), top-p the shortest whose probability reaches p (the crossing id kept;
    of ids tied at its logit, the lower ones). A -inf id is never kept."""
    shifted, weights, bucket, product, mask = SCRATCH.buffers(scaled.size)
    np.subtract(scaled, np.max(scaled), out=shifted)
    edge = filters_edge(shifted, min_p, top_k)
    if edge > -np.inf and (few := np.flatnonzero(shifted >= edge)).size <= shifted.size // FEW:
        return few, kept_among(shifted[few], top_p)
    row_weights = weights[: scaled.size]
    np.exp(shifted, out=row_weights)  # (V,): -inf ids weigh 0
    if edge > -np.inf:
        np.greater_equal(shifted, edge, out=mask)
        np.multiply(row_weights, mask, out=row_weights)
    if top_p < 1.0:
        last, untaken = top_p_edge(shifted, row_weights, top_p, bucket, product)
        np.greater_equal(shifted, last, out=mask)
        np.multiply(row_weights, mask, out=row_weights)
        row_weights[untaken] = 0.0
    return None, weights


def min_p_edge(min_p: float) -> float:
    """The lowest value less the row's largest logit that min-p keeps (-inf: every one)."""
    return np.log(min_p) if min_p > 0.0 else -np.inf


def filters_edge(shifted: np.ndarray, min_p: float, top_k: int) -> float:
    """The lowest value min-p and top-k keep of some of a row's values less its largest logit (-inf: every
    one), `shifted` holding every value top-k keeps."""
    edge = min_p_edge(min_p)
    if 0 < top_k <= shifted.size:
        edge = max(edge, float(np.partition(shifted, -top_k)[-top_k]))
    return edge


def kept_among(values: np.ndarray, top_p: float) -> np.ndarray:
    """The weights of `values` (a few of a row's values, in id order, the largest 0) with those top-p does not
    keep at 0: sorted, as there are few."""
    weights = np.exp(values)
    if top_p < 1.0:
        order = np.argsort(-values, kind="stable")  # descending, lower id first on ties
        ordered = weights[order]
        weights[order[np.cumsum(ordered) - ordered >= top_p * weights.sum()]] = 0.0
    return weights


def buckets(size: int) -> int:
    """How many buckets of value top-p's edge is found by over a row of `size` ids: about 8 ids a bucket, 16
    to BUCKETS (a bucket costs a step of the running sum over them)."""
    return min(BUCKETS, max(16, size // 8))


def top_p_edge(
    shifted: np.ndarray, weights: np.ndarray, top_p: float, bucket: np.ndarray, product: np.ndarray
) -> tuple[float, np.ndarray]:
    """Top-p's edge over the ids of nonzero weight: the last kept id's value (every id above it kept), and the
    ids tied at it that the crossing does not take (the higher ones). The ids go into buckets(V) buckets by
    value (the largest in bucket 0, so that the buckets descend), their weights add up, and only the
    bucket where p times the total is crossed is sorted: a flat 50,257-id row's full sort cost 2 ms."""
    count = buckets(shifted.size)
    lowest = float(np.min(shifted))
    low = max(lowest, -64.0)  # below e^-64 of the largest: the last bucket, with any -inf ids
    scale = (count - 1) / low if low < 0.0 else 0.0  # the lowest value's bucket: count - 1
    if lowest == low:  # every value in range: one pass
        np.multiply(shifted, scale, out=bucket, casting="unsafe")
    else:
        np.multiply(shifted, scale, out=product)  # -inf ids: +inf (or NaN where all others are 0), which fmin clamps
        np.fmin(product, count - 1, out=product)
        np.copyto(bucket, product, casting="unsafe")
    mass = np.bincount(bucket, weights, count)
    target = top_p * mass.sum()
    before = np.cumsum(mass) - mass  # the weight of the buckets above each
    crossing = int(np.count_nonzero(before < target)) - 1  # never an empty bucket: the next one's before is higher
    members = np.flatnonzero(bucket == crossing)
    members = members[weights[members] > 0.0]
    members = members[np.argsort(-shifted[members], kind="stable")]  # descending, lower id first on ties
    inside = weights[members]
    taken = int(np.count_nonzero(before[crossing] + np.cumsum(inside) - inside < target))
    last = float(shifted[members[taken - 1]])
    untaken = members[taken:]
    return last, untaken[shifted[untaken] == last]


def inverse_cdf(weights: np.ndarray, uniform: float) -> int:
    """Of the ids of nonzero weight (weights padded with zeros to whole blocks), in id order, the first whose
    cumulative weight passes `uniform` times their total; the last of them where rounding leaves none."""
    sums = np.cumsum(weights.reshape(-1, BLOCK).sum(axis=1))  # (V / BLOCK,): the weight up to each block's end
    target = uniform * sums[-1]
    block = int(np.searchsorted(sums, target, side="right"))
    if block == sums.size:
        return int(np.flatnonzero(weights)[-1])
    start = block * BLOCK
    running = np.cumsum(weights[start : start + BLOCK]) + (sums[block - 1] if block else 0.0)
    offset = min(int(np.searchsorted(running, target, side="right")), BLOCK - 1)
    return start + int(np.flatnonzero(weights[start : start + offset + 1])[-1])


def running_pick(weights: np.ndarray, uniform: float) -> int:
    """inverse_cdf over a few weights: one running sum."""
    cumulative = np.cumsum(weights)
    index = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
    return index if index < weights.size else int(np.flatnonzero(weights)[-1])


def draw(scaled: np.ndarray, min_p: float, top_k: int, top_p: float, uniform: float) -> int:
    """One id of a temperature-scaled row (V,): of the ids kept_weights keeps, in id order, the first whose
    cumulative weight passes `uniform` times their total. A row with no top-k goes to the compiled draw
    first (whole_draw.py), where it runs."""
    if not 0 < top_k <= scaled.size and (picked := whole_draw.draw(scaled, min_p, top_p, uniform)) is not None:
        return picked
    ids, weights = kept_weights(scaled, min_p, top_k, top_p)
    return inverse_cdf(weights, uniform) if ids is None else int(ids[running_pick(weights, uniform)])


def draw_among(scaled: np.ndarray, size: int, min_p: float, top_k: int, top_p: float, uniform: float) -> int | None:
    """draw's pick, from some of a row's ids that hold its largest logit and every id top-k keeps (`scaled`:
    theirs, in id order, at least top_k of them; the row has `size` ids, more than top_k): its index among
    them, the very id draw picks over the whole row; None where draw would not work on the kept few alone
    (more than size // FEW of them, or fewer than top_k likelier than -inf)."""
    shifted = scaled - np.max(scaled)
    edge = filters_edge(shifted, min_p, top_k)
    few = np.flatnonzero(shifted >= edge)
    if edge == -np.inf or few.size > size // FEW:  # where kept_weights would not take the few alone either
        return None
    return int(few[running_pick(kept_among(shifted[few], top_p), uniform)])


def kept(scaled: np.ndarray, min_p: float, top_k: int, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Which ids kept_weights keeps (a bool each) and the row less its largest logit: new arrays."""
    ids, weights = kept_weights(scaled, min_p, top_k, top_p)
    if ids is None:
        keep = weights[: scaled.size] > 0.0
    else:
        keep = np.zeros(scaled.size, bool)
        keep[ids[weights > 0.0]] = True
    return keep, scaled - np.max(scaled)
