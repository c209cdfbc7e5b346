"""host_draw's draw over a step's rows at once: each row's id, bitwise the one host_draw.draw picks from it
alone, in one set of numpy calls for the whole batch instead of some forty for each row. Knows nothing of
requests, seeds or the pass.

Over 1,024 ids a row's draw is mostly numpy's own cost a call: 16 rows under top-p cost ~1.0 ms drawn one
by one, ~0.45 ms together. Every step is host_draw's, over rows (n, V) instead of one row (V,): the same
elementwise arithmetic, each row's sums in the same order (a row's buckets of value get bincount's offsets
of buckets(V) a row; its running sums run along the row), so that a row's id does not depend on what it is
drawn with. Rows under top-k alone go by their few ids (top_k_draws), the others by their whole rows
(whole_draws); a row under top-k with top-p or min-p, or whose min-p keeps few ids, is drawn alone.
"""

from __future__ import annotations

import threading

import numpy as np

from . import whole_draw
from .host_draw import BLOCK, FEW, buckets, draw, min_p_edge


class Buffers(threading.local):
    """Each thread's buffers for up to `rows` rows of one size (V,), reused from step to step (a fresh
    array of a batch's size would page-fault each time): the scaled rows, their values less their largest,
    weights (padded with zeros to whole blocks), bucket numbers, a product and a mask."""

    rows, size = 0, -1

    def get(self, rows: int, size: int) -> tuple[np.ndarray, ...]:
        if size != self.size or rows > self.rows:
            padded = -(-size // BLOCK) * BLOCK
            self.rows, self.size = max(rows, self.rows if size == self.size else 0), size
            shape = (self.rows, size)
            self.scaled, self.shifted, self.product = np.empty(shape), np.empty(shape), np.empty(shape)
            self.weights = np.zeros((self.rows, padded))  # (n, V rounded up to BLOCK): zeros past V
            self.bucket, self.mask = np.empty(shape, np.int64), np.empty(shape, bool)
        return tuple(b[:rows] for b in (self.scaled, self.shifted, self.weights, self.bucket, self.product, self.mask))


BUFFERS = Buffers()


def buffers(rows: int, size: int) -> tuple[np.ndarray, ...]:
    """This thread's buffers for `rows` rows of `size` ids: scaled, shifted, weights (V rounded up to BLOCK),
    bucket, product and mask, (n, V) each; draws leaves scaled alone."""
    return BUFFERS.get(rows, size)


def draws(
    scaled: np.ndarray, min_p: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, uniform: np.ndarray
) -> np.ndarray:
    """Each temperature-scaled row's id (n,) int64 of rows (n, V) float64, by its min-p, top-k, top-p and
    uniform number (n,) each: host_draw.draw's of that row alone. Rows under top-k alone by their few ids
    (top_k_draws), the others over the whole row (whole_draws); a row neither takes, alone."""
    n, size = scaled.shape
    ids = np.full(n, -1, np.int64)
    by_top_k = (top_k > 0) & (top_k <= size)  # host_draw.filters_edge's
    if whole_draw.available():  # the rows with no top-k: compiled, as host_draw.draw takes them first
        whole = np.flatnonzero(~by_top_k)
        if whole.size:
            ids[whole] = whole_draw.draws(
                scaled[whole] if whole.size < n else scaled, min_p[whole], top_p[whole], uniform[whole]
            )
        if not by_top_k.any():
            return finish(ids, scaled, min_p, top_k, top_p, uniform)
    _, shifted, *_ = BUFFERS.get(n, size)
    np.subtract(scaled, scaled.max(axis=1, keepdims=True), out=shifted)
    few = by_top_k & (top_p >= 1.0) & (min_p <= 0.0)
    for k in sorted(set(top_k[few].tolist())):
        group = np.flatnonzero(few & (top_k == k))
        ids[group] = top_k_draws(shifted[group], k, uniform[group])
    whole = np.flatnonzero(~by_top_k)
    if whole.size and not whole_draw.available():  # where it runs, the compiled draw took them above
        if whole.size < n:
            shifted[: whole.size] = shifted[whole]
        ids[whole] = whole_draws(whole.size, size, min_p[whole], top_p[whole], uniform[whole])
    return finish(ids, scaled, min_p, top_k, top_p, uniform)


def finish(
    ids: np.ndarray, scaled: np.ndarray, min_p: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, uniform: np.ndarray
) -> np.ndarray:
    """ids with each row still at -1 drawn alone (host_draw.draw)."""
    for i in np.flatnonzero(ids < 0).tolist():
        ids[i] = draw(scaled[i], min_p[i], top_k[i], top_p[i], uniform[i])
    return ids


def top_k_draws(shifted: np.ndarray, k: int, uniform: np.ndarray) -> np.ndarray:
    """host_draw.draw's ids of rows under top-k `k` alone, their values less their largest (m, V): the ids at
    least as likely as the k-th (the few, as kept_weights takes them), the pick by their running sum in id
    order (running_pick); -1 where that draw would not take the few (more than V / FEW of them)."""
    m, size = shifted.shape
    edge = np.partition(shifted, -k, axis=1)[:, -k]
    keep = shifted >= edge[:, None]
    counts = np.count_nonzero(keep, axis=1)
    places, members = np.divmod(np.flatnonzero(keep), size)  # by row, ids ascending
    starts = np.cumsum(counts) - counts
    weights = np.zeros((m, int(counts.max())))  # each row's few weights in id order, then zeros
    weights[places, np.arange(places.size) - starts[places]] = np.exp(shifted[places, members])
    running = np.cumsum(weights, axis=1)
    target = uniform * running[np.arange(m), counts - 1]
    within = np.arange(weights.shape[1]) < counts[:, None]
    index = np.count_nonzero((running <= target[:, None]) & within, axis=1)
    taken = (edge > -np.inf) & (counts <= size // FEW) & (index < counts)
    return np.where(taken, members[np.minimum(starts + index, places.size - 1)], -1)


def whole_draws(m: int, size: int, min_p: np.ndarray, top_p: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """host_draw.draw's ids of m rows with no top-k over their whole rows, their values less their largest in
    this thread's buffers' first m rows: min-p's and top-p's kept weights, then the inverse CDF; -1 where that
    draw would take min-p's few ids, or rounding left the pick past the last block."""
    _, shifted, weights, bucket, product, mask = BUFFERS.get(m, size)
    edges = np.array([min_p_edge(p) for p in min_p.tolist()])
    few = np.zeros(m, bool)
    bounded = np.flatnonzero(edges > -np.inf)
    if bounded.size:  # min-p keeping at most 1/FEW of a row: those ids alone
        kept = np.count_nonzero(shifted[bounded] >= edges[bounded, None], axis=1)
        few[bounded[kept <= size // FEW]] = True
    row_weights = weights[:, :size]
    np.exp(shifted, out=row_weights)  # (m, V): -inf ids weigh 0
    if bounded.size:
        np.greater_equal(shifted, edges[:, None], out=mask)
        np.multiply(row_weights, mask, out=row_weights)
    nucleus = np.flatnonzero((top_p < 1.0) & ~few)
    if nucleus.size:
        last = np.full(m, -np.inf)
        last[nucleus] = top_p_edges(shifted[nucleus], row_weights, nucleus, top_p[nucleus], bucket, product)
        np.greater_equal(shifted, last[:, None], out=mask)
        np.multiply(row_weights, mask, out=row_weights)
    return np.where(few, -1, inverse_cdfs(weights, uniform))


def top_p_edges(
    shifted: np.ndarray,
    weights: np.ndarray,
    rows: np.ndarray,
    top_p: np.ndarray,
    bucket: np.ndarray,
    product: np.ndarray,
) -> np.ndarray:
    """host_draw.top_p_edge of the rows `rows` (m,) of weights (n, V), whose values less their largest are
    `shifted` (m, V): each one's last kept id's value (m,), the ids tied at it that the crossing does not
    take set to weigh 0."""
    m, size = shifted.shape
    count = buckets(size)
    lowest = shifted.min(axis=1)
    low = np.maximum(lowest, -64.0)
    scale = np.divide(count - 1, low, out=np.zeros(m), where=low < 0.0)
    bucket, product = bucket[:m], product[:m]
    if (lowest == low).all():
        np.multiply(shifted, scale[:, None], out=bucket, casting="unsafe")
    else:
        np.multiply(shifted, scale[:, None], out=product)
        np.fmin(product, count - 1, out=product)
        np.copyto(bucket, product, casting="unsafe")
    offsets = np.arange(m) * count  # each row's buckets after the rows' before it: one bincount
    bucket += offsets[:, None]
    mass = np.bincount(bucket.ravel(), weights[rows, :size].ravel(), m * count).reshape(m, count)
    target = top_p * mass.sum(axis=1)
    before = np.cumsum(mass, axis=1) - mass
    crossing = np.count_nonzero(before < target[:, None], axis=1) - 1
    places, members = np.divmod(np.flatnonzero(bucket == (offsets + crossing)[:, None]), size)
    places, members, inside, value = crossing_members(places, members, shifted, weights, rows)
    counts = np.bincount(places, minlength=m)
    starts = np.cumsum(counts) - counts
    order = np.arange(places.size) - starts[places]
    padded = np.zeros((m, int(counts.max())))  # each row's members' weights, in its order, then zeros
    padded[places, order] = inside
    running = np.cumsum(padded, axis=1)
    before_crossing = before[np.arange(m), crossing]
    within = np.arange(padded.shape[1]) < counts[:, None]
    taken = np.count_nonzero((before_crossing[:, None] + running - padded < target[:, None]) & within, axis=1)
    last = value[starts + taken - 1]
    untaken = (order >= taken[places]) & (value == last[places])
    weights[rows[places[untaken]], members[untaken]] = 0.0
    return last


def crossing_members(
    places: np.ndarray, members: np.ndarray, shifted: np.ndarray, weights: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ids (`places`: the row's place in `shifted` (m, V), which is row `rows[place]` of `weights`;
    `members`: the id) of each row's crossing bucket that weigh anything, by row, then value descending,
    lower id first on ties (host_draw.top_p_edge's stable sort of a row's): with their weights and values."""
    inside = weights[rows[places], members]
    heavy = inside > 0.0
    places, members, inside = places[heavy], members[heavy], inside[heavy]
    value = shifted[places, members]
    order = np.lexsort((members, -value, places))
    return places[order], members[order], inside[order], value[order]


def inverse_cdfs(weights: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """host_draw.inverse_cdf of each row of weights (n, V rounded up to BLOCK) by its uniform number (n,):
    -1 for a row that falls past its last block (rounding), which host_draw picks alone."""
    n = weights.shape[0]
    blocks = weights.reshape(n, -1, BLOCK)  # (n, V / BLOCK, BLOCK)
    sums = np.cumsum(blocks.sum(axis=2), axis=1)  # the weight up to each block's end
    target = uniform * sums[:, -1]
    block = np.count_nonzero(sums <= target[:, None], axis=1)
    inside = block < sums.shape[1]
    block = np.where(inside, block, 0)
    chunk = blocks[np.arange(n), block]  # (n, BLOCK)
    below = np.where(block > 0, sums[np.arange(n), block - 1], 0.0)
    running = np.cumsum(chunk, axis=1) + below[:, None]
    offset = np.minimum(np.count_nonzero(running <= target[:, None], axis=1), BLOCK - 1)
    places = np.arange(BLOCK)
    found = np.where((chunk > 0.0) & (places <= offset[:, None]), places, -1).max(axis=1)
    return np.where(inside & (found >= 0), block * BLOCK + found, -1)
