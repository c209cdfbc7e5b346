"""Beam search over one request's rows of logits, step by step, as transformers' `generate(num_beams=k)`
defines it (its vectorized `_beam_search`, transformers 5): the same candidates, the same finished
hypotheses and scores, the same stopping rules, so that the same logits give the same tokens.

Each step takes the k running beams' rows (k, V): log-softmax in float32, the banned ids masked, each
row's log-probabilities added to its beam's running score; the best `keep` of the k x V continuations
(keep = 2k, or k per end id plus k where a model has several); of those, the best k that do not end
(an end id, or the length budget reached) run on, and those among the best k that end become
hypotheses, scored by their sum of log-probabilities over (generated length) ** length_penalty, the
best k kept. It stops when every candidate ends, when no running beam can beat the worst kept
hypothesis (transformers' heuristic, by `early_stopping`: False, True or "never"), or, with True,
once k hypotheses are kept.

Pure numpy: it knows nothing of the engine (beam_group.py runs it over slots, and so does the
export's beam gate); `reassign` says which slot each next beam takes and which caches to copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .domain import BeamParams

# An entry ruled out (a beam that does not run, a hypothesis slot still empty, a candidate that did not end).
# transformers writes -1e9, a finite score that a real one can fall below: with a negative length penalty a
# hypothesis's score grows with length ** -penalty (-300 * 32 ** 5 is -1e10), the empty slots outranked
# every hypothesis and a search ended with none. -inf is below every score a real entry can have.
NEG = np.float32(-np.inf)


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest of 1-D `scores`, largest first (ties: the lower index first, also among
    those tied at the k-th)."""
    k = min(k, scores.size)
    if k < scores.size:
        kth = -np.partition(-scores, k - 1)[k - 1]
        above = np.flatnonzero(scores > kth)
        part = np.concatenate([above, np.flatnonzero(scores == kth)[: k - above.size]])
    else:
        part = np.arange(scores.size)
    return part[np.lexsort((part, -scores[part]))]


def row_candidates(rows: np.ndarray, banned: tuple[int, ...], keep: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's `keep` best continuations, from rows of logits (k, V): their ids (k, keep) and
    log-probabilities (float32, the banned ids' -inf), best first, lower id first on ties."""
    scores = log_softmax(rows)
    if banned:
        scores[:, list(banned)] = -np.inf
    ids = np.stack([top(row, keep) for row in scores])
    return ids, np.take_along_axis(scores, ids, axis=1)


def top_candidates(
    pairs: tuple[tuple[int, float], ...], banned: tuple[int, ...], keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """One row's `keep` best continuations from its likeliest (id, log-probability) pairs, best first, lower
    id first on ties (a batched logits pass's top ids of the row, unbanned, log-softmaxed in float32):
    the banned ids left out, so `pairs` must hold `keep` more than `banned`."""
    kept = [(token, value) for token, value in pairs if token not in banned][:keep]
    assert len(kept) == keep, "a beam's pass asks for its keep and its bans"
    ids, values = zip(*kept)
    return np.array(ids, np.int64), np.array(values, np.float32)


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """(k, V) float32 log-probabilities of rows of logits."""
    rows = rows.astype(np.float32, copy=False)
    shifted = rows - rows.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def reassign(keys: list[int], moves: list[tuple[int, int]]) -> tuple[list[int], list[tuple[int, int]]]:
    """The slot (key) each next beam takes, given the beams' keys and each next beam's (parent, token),
    and the cache copies (src, dst) that make it so: a next beam that continues a beam whose key no
    earlier one took keeps that key; each other takes the key of a beam no next beam continues, with a
    copy of its parent's cache. Every src keeps its own state, so the copies may run in any order."""
    claimed: dict[int, int] = {}  # next beam -> its key
    for i, (parent, _) in enumerate(moves):
        if keys[parent] not in claimed.values():
            claimed[i] = keys[parent]
    free = [key for key in keys if key not in claimed.values()]
    copies = []
    for i, (parent, _) in enumerate(moves):
        if i not in claimed:
            claimed[i] = free.pop()
            copies.append((keys[parent], claimed[i]))
    return [claimed[i] for i in range(len(moves))], copies


@dataclass(frozen=True)
class Hypothesis:
    """A finished beam: its generated tokens (the end id last, where one ended it) and its score."""

    tokens: tuple[int, ...]
    score: float
    ended: bool  # by an end id (else by the length budget)


class BeamSearch:
    """One request's beams: `step` takes their rows and says which beam each next beam continues."""

    def __init__(self, params: BeamParams, ends: frozenset[int], budget: int):
        """`ends`: the ids that end a hypothesis (EOS, stop ids); `budget`: tokens it may generate."""
        self.params, self.ends, self.budget = params, np.array(sorted(ends), np.int64), budget
        k = params.num_beams
        self.keep = max(2, 1 + len(ends)) * k
        self.running_scores = np.full(k, NEG, np.float32)
        self.running_scores[0] = 0.0  # the k beams start equal: only the first one's continuations count
        self.running: list[tuple[int, ...]] = [() for _ in range(k)]
        self.kept_scores = np.full(k, NEG, np.float32)  # the best k hypotheses' scores (NEG: none yet)
        self.kept: list[Hypothesis | None] = [None] * k
        self.generated = 0  # tokens each running beam holds
        self.can_improve = True  # transformers' early-stop heuristic, sticky once it says no
        self.done = False

    def step_rows(self, rows: np.ndarray, banned: tuple[int, ...] = ()) -> list[tuple[int, int]]:
        """step() from the k running beams' rows of logits (k, V), in beam order."""
        return self.step(*row_candidates(rows, banned, self.keep))

    def step(self, ids: np.ndarray, logprobs: np.ndarray) -> list[tuple[int, int]]:
        """The k running beams' best continuations, in beam order: `ids` (k, m) and their `logprobs`
        (float32; m >= keep, or the whole row), each row best first, lower id first on ties
        (row_candidates, top_candidates). Each next beam as (the beam it continues, its token), best
        first. Sets `done` when the search ends (hypotheses()). The best `keep` of the k x V
        continuations are among each row's best `keep`, in the same order (the running score is the
        row's, and a row's ties are in id order): the whole rows' best, where `keep` of them are finite
        (else those ruled out, at -inf, may be others)."""
        k, m = ids.shape
        flat = (logprobs + self.running_scores[:, None]).reshape(-1)
        picked = top(flat, self.keep)
        totals, beams, tokens = flat[picked], picked // m, ids.reshape(-1)[picked]
        length = self.generated + 1
        ends = np.isin(tokens, self.ends) | (length >= self.budget)
        self.keep_finished(totals, beams, tokens, ends, length)
        running = np.where(ends, NEG, totals).astype(np.float32)
        chosen = top(running, k)
        self.running = [(*self.running[beams[j]], int(tokens[j])) for j in chosen]
        self.running_scores = running[chosen]
        self.generated = length
        self.check_heuristic()
        full = all(h is not None for h in self.kept) and self.params.early_stopping == "true"
        self.done = not self.can_improve or full or bool(ends.all())
        return [(int(beams[j]), int(tokens[j])) for j in chosen]

    def keep_finished(self, totals, beams, tokens, ends, length: int) -> None:
        """The best k of the hypotheses kept and the candidates among the best k that just ended. (A step
        runs only while the heuristic says a beam can improve and, with early_stopping True, fewer than k
        are kept: transformers' further rule-outs for those cases never apply here.)"""
        k = self.params.num_beams
        scored = (totals / np.float32(length**self.params.length_penalty)).astype(np.float32)
        candidate = ends & (np.arange(len(totals)) < k)
        scored = np.where(candidate, scored, NEG).astype(np.float32)
        merged = np.concatenate([self.kept_scores, scored]).astype(np.float32)
        order = top(merged, k)
        kept: list[Hypothesis | None] = []
        for i in order:
            if i < k:
                kept.append(self.kept[i])
            elif candidate[i - k]:
                j = i - k
                last = int(tokens[j])
                kept.append(Hypothesis((*self.running[beams[j]], last), float(merged[i]), last in self.ends))
            else:
                kept.append(None)  # an entry ruled out, kept only as transformers keeps it: never returned
        self.kept, self.kept_scores = kept, merged[order]

    def check_heuristic(self) -> None:
        """Whether a running beam could still beat the worst kept hypothesis (transformers' heuristic)."""
        params = self.params
        if params.early_stopping == "never" and params.length_penalty > 0.0:
            length = self.budget
        else:
            length = self.generated
        best = self.running_scores[0] / np.float32(length**params.length_penalty)
        worst = [self.kept_scores.min() if h is not None else NEG for h in self.kept]
        self.can_improve = self.can_improve and any(best > w for w in worst)

    def hypotheses(self) -> list[Hypothesis]:
        """The best `num_return_sequences` hypotheses, best first."""
        return [h for h in self.kept[: self.params.num_return_sequences] if h is not None]
