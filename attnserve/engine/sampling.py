"""Per-request token selection in numpy: greedy, temperature, min-p, top-k, top-p, the repetition,
presence and frequency penalties, and the masks (banned ids, a grammar's allowed ids).

Each request in a batch has its own Sampler and its own numpy Generator, so a seeded request
gives the same tokens whatever else shares its batch. Greedy is np.argmax on the float32
logits, which picks the first maximum exactly as torch.argmax does. Knows nothing of batching:
the engine takes plain greedy rows' argmax over the whole batch itself (engine._advance).
"""

from __future__ import annotations

import numpy as np

from .domain import SamplingParams, TokenLogprob


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """CTRL's penalty (as in Hugging Face): seen tokens' positive logits / penalty, negative * penalty.
    In float64: a penalty near the smallest allowed would overflow float32 logits to inf (then NaN)."""
    out = logits.astype(np.float64)
    picked = out[seen]
    out[seen] = np.where(picked > 0, picked / penalty, picked * penalty)
    return out


def apply_occurrence_penalties(logits: np.ndarray, counts: np.ndarray, presence: float, frequency: float) -> np.ndarray:
    """OpenAI's presence and frequency penalties (as vLLM applies them): each id's logit less
    `frequency` times its count in the completion and `presence` once if it occurs there at all.
    The prompt's ids do not count. In float64, a copy."""
    return logits.astype(np.float64) - (frequency * counts + presence * (counts > 0))


def bias_and_ban(logits: np.ndarray, bias: tuple[tuple[int, float], ...], banned: tuple[int, ...]) -> np.ndarray:
    """A float64 copy of `logits` with each (id, bias) added and the banned ids at -inf."""
    out = logits.astype(np.float64)  # a copy: `logits` may be the runner's buffer
    for token, value in bias:
        out[token] += value
    out[list(banned)] = -np.inf
    return out


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep logits at least as large as the k-th largest (ties kept), -inf elsewhere."""
    if k <= 0 or k >= logits.size:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf)


def min_p_filter(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Keep the ids whose probability is at least min_p times the likeliest id's (vLLM's and
    transformers' min_p: a logit at least the largest plus log(min_p)), -inf elsewhere."""
    if min_p <= 0.0:
        return logits
    return np.where(logits >= np.max(logits) + np.log(min_p), logits, -np.inf)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose probability reaches p (equal logits in the
    order of their ids), -inf elsewhere. Sorts the values, not the ids (a stable argsort of a 2048-id
    row cost 70 us a token): the kept set is every id above the crossing token's logit and, at that
    logit, as many of its ids as the cumulative count reached, lowest ids first."""
    if p >= 1.0:
        return logits
    ranked = -np.sort(-logits)  # descending: the order a stable argsort gives, by value
    probs = softmax(ranked)
    # the first dropped (the token that crosses p is kept; the first is never dropped): how many are kept
    count = int(np.argmax(np.cumsum(probs) - probs >= p)) or logits.size
    edge = ranked[count - 1]
    keep = logits > edge
    ties = np.flatnonzero(logits == edge)[: count - int(keep.sum())]
    keep[ties] = True
    return np.where(keep, logits, -np.inf)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Over the last axis, in float64; -inf where the logit is -inf."""
    shifted = logits.astype(np.float64) - np.max(logits, axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def prompt_logprobs(rows: np.ndarray, prompt: tuple[int, ...], top: int) -> tuple[TokenLogprob, ...]:
    """Each prompt token after the first: its log-probability given the ones before it (the model's
    raw distribution, row i of `rows` predicting token i + 1) and the `top` most likely ids there."""
    logprobs = log_softmax(rows[:-1])
    best = np.argsort(-logprobs, axis=1, kind="stable")[:, :top]
    return tuple(
        TokenLogprob(token, float(row[token]), tuple((int(i), float(row[i])) for i in ids))
        for token, row, ids in zip(prompt[1:], logprobs, best)
    )


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - np.max(logits))
    return shifted / shifted.sum()


class Sampler:
    """Picks one request's tokens from its row of logits, one step at a time."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids: tuple[int, ...] = ()):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.seen = np.zeros(vocab_size, dtype=bool)  # tokens of prompt and completion
        self.seen[[i for i in prompt_ids if 0 <= i < vocab_size]] = True
        self.counts = np.zeros(vocab_size, dtype=np.int64)  # each id's count in the completion

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no penalty and no bias: the token is the row's argmax, which the engine takes for
        the whole batch at once (`seen` and `counts` then matter to nobody)."""
        p = self.params
        penalized = p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        return p.greedy and not penalized and not p.logit_bias

    def __call__(self, logits: np.ndarray, banned: tuple[int, ...] = (), allowed: np.ndarray | None = None) -> int:
        """The next token from this request's logits (V,), never one of `banned`, and one of `allowed`
        (a bool per id) if given; remembers it for the penalties. The penalties, then the bias, then the
        ban and the grammar's mask, then greedy or temperature, min-p, top-k and top-p."""
        return self.take(self.processed(logits, banned, allowed))

    def with_logprobs(
        self, logits: np.ndarray, banned: tuple[int, ...], top: int, allowed: np.ndarray | None = None
    ) -> tuple[int, TokenLogprob]:
        """__call__'s token, and its log-probability under the processed distribution (after the penalties,
        the bias, the masks and the temperature; before min-p, top-k and top-p, as vLLM's processed_logprobs),
        with the `top` most likely ids."""
        processed = self.processed(logits, banned, allowed)
        token = self.take(processed)
        logprobs = log_softmax(processed)
        best = np.argsort(-logprobs, kind="stable")[:top]
        return token, TokenLogprob(token, float(logprobs[token]), tuple((int(i), float(logprobs[i])) for i in best))

    def processed(self, logits: np.ndarray, banned: tuple[int, ...], allowed: np.ndarray | None = None) -> np.ndarray:
        """The row a token is picked from: the penalties (repetition, then presence and frequency), the
        bias, the ban and the mask, then (sampling) the temperature."""
        p = self.params
        if p.repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, self.seen, p.repetition_penalty)
        if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            logits = apply_occurrence_penalties(logits, self.counts, p.presence_penalty, p.frequency_penalty)
        if p.logit_bias or banned:
            logits = bias_and_ban(logits, p.logit_bias, banned)
        if allowed is not None:
            logits = np.where(allowed, logits, -np.inf)
        return logits if p.greedy else logits.astype(np.float64) / p.temperature

    def take(self, processed: np.ndarray) -> int:
        """Greedy argmax, or a draw after min-p, top-k and top-p; the token is remembered for the penalties."""
        token = int(np.argmax(processed)) if self.params.greedy else self._sample(processed)
        if 0 <= token < self.seen.size:
            self.seen[token] = True
            self.counts[token] += 1
        return token

    def _sample(self, scaled: np.ndarray) -> int:
        p = self.params
        scaled = top_p_filter(top_k_filter(min_p_filter(scaled, p.min_p), p.top_k), p.top_p)
        cumulative = np.cumsum(softmax(scaled))
        index = np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right")
        return int(min(index, scaled.size - 1))
