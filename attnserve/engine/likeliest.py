"""The few ids of a row of logits among which its likeliest lie, found without a pass over it in float64:
where the compiled library runs, every id at least as likely as the row's count-th likeliest
(whole_draw.likeliest: two passes over the float32 row, 19 us against numpy's 38 for a top-k of 50 over
50,257 ids, warm); else the maxima of its groups of GROUP ids (GROUP slices of the float32 row, the
elementwise maximum of them: each group's ids are V / GROUP apart, which vectorizes where groups of
neighbours do not), then every id at least as likely as the count-th largest of those maxima (a few more
ids). A top-k draw or a greedy row's top log-probabilities need only those ids (sampling.pick_row's few
picks), which either way hold them all. Knows nothing of requests or seeds.
"""

from __future__ import annotations

import numpy as np

from . import whole_draw
from .seam import FEW_IDS_FROM

GROUP = 16  # ids a group: the row's maxima by groups, one a group
FEWEST = 8  # the candidates are worth it where at most 1/FEWEST of the row


def candidates(logits: np.ndarray, count: int) -> np.ndarray | None:
    """The ids (ascending) of a row (V,) at least as likely as its count-th likeliest (at least `count` ids),
    compiled where the library runs; else numpy's, those at least as likely as the count-th largest of its
    groups' maxima (which is no more than the row's count-th likeliest: a few more ids). None where they
    would be more than 1/FEWEST of the row, where the row has no more groups than `count`, or fewer than
    FEW_IDS_FROM ids."""
    if logits.size < FEW_IDS_FROM:
        return None
    whole = logits.size // GROUP * GROUP
    if count >= whole // GROUP + logits.size - whole:  # the groups: the last ids a group each
        return None
    if whole_draw.available() and whole_draw.readable(logits):
        return whole_draw.likeliest(logits, count, logits.size // FEWEST)
    maxima = logits[:whole].reshape(GROUP, -1).max(axis=0)  # (V / GROUP,): a group is ids V / GROUP apart
    if whole < logits.size:
        maxima = np.concatenate([maxima, logits[whole:]])  # the last ids, a group each
    ids = np.flatnonzero(logits >= np.partition(maxima, -count)[-count])
    return ids if ids.size <= logits.size // FEWEST else None
