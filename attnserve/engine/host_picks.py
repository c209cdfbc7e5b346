"""A step's rows picked on the host together (the rows a runner's batched pass left to the host): each row's
Pick, bitwise sampling.pick_row's of it alone, in one set of numpy calls for the rows together where that
costs less. Knows nothing of requests, seeds or the pass.

Over a small vocabulary a row's pick is mostly numpy's own cost a call: 16 rows of 1,024 ids cost 1.6-2.3x
less together than one by one (batch_draw.py their draws). Over a large one the work is in the passes over
each row, which stay in the cache one row at a time, so rows are picked one by one there (above
TOGETHER_UP_TO ids), as they are where few rows are left to the host (below TOGETHER_FROM); but for the
draws the compiled draw takes as they are (whole_draw.py: a temperature, bans and no top-k, no log-probability),
which go to it together, shared out between its threads. A grammar's row is picked alone: its mask is its
own copy of the row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import whole_draw
from .batch_draw import buffers, draws
from .host_draw import SCRATCH
from .sampling import (
    banned_copy,
    compiled_greedy,
    greedy_scored,
    plain_draw,
    processed_row,
    scores_compiled,
)
from .seam import PassRow, Pick

# measured standalone on the project's 2-vCPU Xeon, together over one by one: 1,024 ids, 8 rows 1.3-1.8x by
# kind, 16 rows 1.5-2.3x, 64 rows 1.3-2.8x; 2,048 ids 0.9-1.4x, 1.2-1.6x, 0.9-1.8x (top-k the least); 3,000 ids,
# 16 rows 1.0-1.3x, 64 0.8-1.5x; 4 rows of any 0.8-1.3x
TOGETHER_FROM = 8  # rows: below, picked one by one
TOGETHER_UP_TO = 2048  # ids: above, one by one


def together(row: PassRow) -> bool:
    """Whether `row` is picked with the others: any but a grammar's (its mask is its own copy of the row)."""
    return row.allowed is None


def pick_together(logits: Sequence[np.ndarray], rows: Sequence[PassRow], scored: Sequence[bool]) -> list[Pick | None]:
    """The picks of the rows of `logits` (V,) float32 by their PassRows, scored or not, that are picked
    together (sampling.pick_row's, bitwise); None for each row left to be picked alone (all of them where
    the vocabulary is large or few rows are together; a row alone is always left alone: none of the ways
    below takes fewer than two)."""
    if len(rows) < 2:
        return [None] * len(rows)
    size = logits[0].size
    joined = [i for i, row in enumerate(rows) if together(row)]
    picks: list[Pick | None] = [None] * len(rows)
    if size > TOGETHER_UP_TO:
        return compiled_picks(logits, rows, scored)
    if len(joined) < TOGETHER_FROM:
        return picks
    got = picked([logits[i] for i in joined], [rows[i] for i in joined], [scored[i] for i in joined])
    for i, pick in zip(joined, got):
        picks[i] = pick
    return picks


def compiled_picks(logits: Sequence[np.ndarray], rows: Sequence[PassRow], scored: Sequence[bool]) -> list[Pick | None]:
    """Over a large vocabulary, the picks the compiled library makes where it runs, each pick_row's of that row
    alone: the draws that ask for no log-probability and change nothing of their rows but the temperature and
    bans (sampling.plain_draw; a banning row read from its banned_copy in this thread's SCRATCH), together
    in the compiled draw (whole_draw.draws_logits), and the greedy rows that ask for log-probabilities
    (sampling.scores_compiled) by whole_draw.scores_rows; each set shared out between its threads. None for
    every other row, and for a row the library leaves to numpy."""
    picks: list[Pick | None] = [None] * len(rows)
    if not whole_draw.available():
        return picks
    size = logits[0].size
    readable = [whole_draw.readable(row) for row in logits]
    plain = [i for i, row in enumerate(rows) if not scored[i] and plain_draw(row, size) and readable[i]]
    if len(plain) >= 2:
        column = lambda name: np.array([getattr(rows[i], name) for i in plain], np.float64)
        read = [banned_copy(logits[i], rows[i], room) for i, room in zip(plain, SCRATCH.banned_rows(len(plain), size))]
        ids = whole_draw.draws_logits(read, column("temperature"), column("min_p"), column("top_p"), column("uniform"))
        for i, token in zip(plain, ids.tolist()):
            picks[i] = Pick(token, 0.0) if token >= 0 else None
    greedy = [i for i, row in enumerate(rows) if scored[i] and scores_compiled(row) and readable[i]]
    if len(greedy) >= 2:
        counts = [max(rows[i].top, 1) for i in greedy]
        got = whole_draw.scores_rows([logits[i] for i in greedy], counts, [rows[i].banned for i in greedy])
        for i, compiled in zip(greedy, got):
            picks[i] = None if compiled is None else greedy_scored(rows[i], *compiled)
    return picks


def picked(logits: Sequence[np.ndarray], rows: Sequence[PassRow], scored: Sequence[bool]) -> list[Pick]:
    """The picks of rows that are picked together (`together`): the rows processed (sampling.processed_row),
    then the greedy rows' argmax and the others' draws (batch_draw.draws), then the scored rows'
    log-probabilities."""
    scaled = processed_rows(logits, rows)
    tokens = np.argmax(scaled, axis=1)
    drawn = np.array([row.temperature > 0 for row in rows])
    if drawn.any():
        column = lambda values: np.array(values)[drawn]
        tokens[drawn] = draws(
            scaled[drawn],
            column([row.min_p for row in rows]),
            column([row.top_k for row in rows]),
            column([row.top_p for row in rows]),
            column([row.uniform for row in rows]),
        )
    picks = [Pick(int(token), 0.0) for token in tokens.tolist()]
    asked = np.flatnonzero(scored).tolist()
    compiled = {i: pick for i in asked if (pick := compiled_greedy(logits[i], rows[i])) is not None}  # as alone
    for i, pick in compiled.items():
        picks[i] = pick
    places = np.array([i for i in asked if i not in compiled], np.int64)
    if places.size:  # after the draws: their buffers hold the log-probabilities
        logprobs = log_softmax_rows(scaled[places])
        values = logprobs[np.arange(places.size), tokens[places]].tolist()
        tops = best_rows(logprobs, [rows[i].top for i in places.tolist()])
        for i, value, top in zip(places.tolist(), values, tops):
            picks[i] = Pick(picks[i].token, value, top)
    return picks


def log_softmax_rows(scaled: np.ndarray) -> np.ndarray:
    """sampling.log_softmax of rows (m, V), bitwise each row's alone, in this thread's buffers (fresh arrays
    of a batch's size would cost their pages)."""
    m, size = scaled.shape
    _, shifted, weights, *_ = buffers(m, size)
    weights = weights[:, :size]
    np.subtract(scaled, np.max(scaled, axis=-1, keepdims=True), out=shifted)
    total = np.exp(shifted, out=weights).sum(axis=-1, keepdims=True)
    return np.subtract(shifted, np.log(total), out=shifted)


def best_rows(logprobs: np.ndarray, tops: list[int]) -> list[tuple[tuple[int, float], ...]]:
    """sampling.best of each row of log-probabilities (m, V) with its `top`: the rows that ask for the same
    number of ids at once."""
    found: list[tuple[tuple[int, float], ...]] = [()] * len(tops)
    for top in set(tops) - {0}:
        asked = np.flatnonzero(np.array(tops) == top)
        top = min(top, logprobs.shape[1])
        chosen = logprobs[asked]
        edge = np.partition(chosen, -top, axis=1)[:, -top]
        places, ids = np.divmod(np.flatnonzero(chosen >= edge[:, None]), chosen.shape[1])
        values = chosen[places, ids]
        order = np.lexsort((ids, -values, places))  # by row, descending, lower id first on ties
        places, ids, values = places[order], ids[order].tolist(), values[order].tolist()
        starts = np.searchsorted(places, np.arange(asked.size)).tolist()
        for place, start in zip(asked.tolist(), starts):
            found[place] = tuple(zip(ids[start : start + top], values[start : start + top]))
    return found


def processed_rows(logits: Sequence[np.ndarray], rows: Sequence[PassRow]) -> np.ndarray:
    """Each row processed (sampling.processed_row), (n, V) float64 in this thread's buffer: the rows with
    only a temperature (or none) at once, each other one by itself."""
    scaled = buffers(len(rows), logits[0].size)[0]
    plain = [i for i, row in enumerate(rows) if not row.bias and not row.penalized]
    if len(plain) < len(rows):
        for i, (values, row) in enumerate(zip(logits, rows)):
            processed_row(values, row, scaled[i])
        return scaled
    for i, values in enumerate(logits):
        np.copyto(scaled[i], values)
    divisors = np.array([row.temperature if row.temperature > 0 else 1.0 for row in rows])
    return np.divide(scaled, divisors[:, None], out=scaled)
