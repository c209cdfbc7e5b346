"""Per-request token selection in numpy: greedy, temperature, min-p, top-k, top-p, the repetition,
presence and frequency penalties, and the masks (banned ids, a grammar's allowed ids).

Each request in a batch has its own Sampler. A draw takes one uniform number made from the
request's seed and the token's position alone (counter_uniform: stateless), and picks by inverse
CDF over the kept ids in id order; so a seeded request gives the same tokens whatever else shares
its batch, whichever side picks them, and after a restart. Greedy is np.argmax on the float32
logits, which picks the first maximum exactly as torch.argmax does.
Knows nothing of batching: the engine takes plain greedy rows' argmax over the whole batch itself
(engine._advance), and a runner may pick the rows a Sampler describes as a PassRow in one batched
pass where the logits are (seam.py); this module is that pass's oracle and its host side.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import whole_draw
from .domain import SamplingParams, TokenLogprob
from .host_draw import SCRATCH, draw, draw_among
from .likeliest import candidates
from .seam import FEW_IDS_FROM, PassRow, Pick, scores_compiled

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 over the golden ratio, odd
MIN_PASSED_PENALTY = 1e-20  # a smaller repetition penalty could take a logit past float32's range in the pass


def mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit integers that scatters every bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def counter_uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) from (seed, position) alone: counter-based, so a draw depends on
    nothing else. 24 bits, exact in float32 (the batched pass's input). The seed is mixed from seed +
    GOLDEN, not from the seed itself: mix64(0) is 0, so seed 0 (a common choice) would start at 0 and
    pick the first kept id of every row as its first token."""
    state = mix64((seed + GOLDEN) & MASK64)
    return (mix64((state + position) & MASK64) >> 40) / float(1 << 24)


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """CTRL's penalty (as in Hugging Face): seen tokens' positive logits / penalty, negative * penalty
    (`seen`: their ids, or a bool per id). In float64: a penalty near the smallest allowed would
    overflow float32 logits to inf (then NaN)."""
    return penalize_repetition(logits.astype(np.float64), seen, penalty)


def penalize_repetition(values: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """apply_repetition_penalty in place, on float64 `values`."""
    picked = values[seen]
    values[seen] = np.where(picked > 0, picked / penalty, picked * penalty)
    return values


def apply_occurrence_penalties(
    logits: np.ndarray, ids: np.ndarray, counts: np.ndarray, presence: float, frequency: float
) -> np.ndarray:
    """OpenAI's presence and frequency penalties (as vLLM applies them): each id's logit less
    `frequency` times its count in the completion and `presence` once if it occurs there at all
    (`ids` each once, with their `counts`). The prompt's ids do not count. In float64, a copy."""
    return penalize_occurrences(logits.astype(np.float64), ids, counts, presence, frequency)


def penalize_occurrences(
    values: np.ndarray, ids: np.ndarray, counts: np.ndarray, presence: float, frequency: float
) -> np.ndarray:
    """apply_occurrence_penalties in place, on float64 `values`."""
    values[ids] -= frequency * counts + presence
    return values


class Occurrences:
    """Ids in the order they first came, each once, with how often each came: arrays that grow in place,
    so that a step reads them without building them (a PassRow's views)."""

    def __init__(self, ids: tuple[int, ...] = ()):
        self._ids = np.empty(max(16, 2 * len(ids)), np.int64)
        self._counts = np.zeros(self._ids.size, np.int64)
        self.slots: dict[int, int] = {}
        for token in ids:
            self.add(token)

    def add(self, token: int) -> None:
        slot = self.slots.get(token)
        if slot is None:
            slot = len(self.slots)
            if slot == self._ids.size:
                self._ids = np.concatenate([self._ids, np.empty_like(self._ids)])
                self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
            self.slots[token] = slot
            self._ids[slot] = token
        self._counts[slot] += 1

    def copy(self) -> Occurrences:
        """Another set of the same ids and counts, that grows apart from this one (a burst's, run ahead of
        its request's)."""
        other = Occurrences()
        other._ids, other._counts, other.slots = self._ids.copy(), self._counts.copy(), dict(self.slots)
        return other

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: len(self.slots)]

    @property
    def counts(self) -> np.ndarray:
        return self._counts[: len(self.slots)]


def unpacked(bits: np.ndarray, vocab_size: int) -> np.ndarray:
    """A bool per id of a grammar's packed mask (int32 words, bit i of word j for id 32j + i): may it come
    next?"""
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab_size].view(bool)


def allows_beyond(bits: np.ndarray, ids: tuple[int, ...]) -> bool:
    """Does a grammar's packed mask allow some id not in `ids`?"""
    total = int(np.unpackbits(bits.view(np.uint8)).sum())
    among = sum(int(bits[i >> 5]) >> (i & 31) & 1 for i in set(ids))
    return total > among


def add_bias(values: np.ndarray, bias: Iterable[tuple[int, float]]) -> np.ndarray:
    """`values` (float64) with each (id, bias) added in place, in order (a ban's bias is -inf)."""
    for token, value in bias:
        values[token] += value
    return values


def bias_and_ban(logits: np.ndarray, bias: tuple[tuple[int, float], ...], banned: tuple[int, ...]) -> np.ndarray:
    """A float64 copy of `logits` with each (id, bias) added and the banned ids at -inf."""
    out = add_bias(logits.astype(np.float64), bias)  # a copy: `logits` may be the runner's buffer
    out[list(banned)] = -np.inf
    return out


def best(logprobs: np.ndarray, top: int) -> tuple[tuple[int, float], ...]:
    """The `top` most likely ids of a row of log-probabilities with theirs, lower id first on ties (a
    stable sort of only the ids at least as likely as the top-th)."""
    if top <= 0:
        return ()
    top = min(top, logprobs.size)
    likely = np.flatnonzero(logprobs >= np.partition(logprobs, -top)[-top])
    ids = likely[np.argsort(-logprobs[likely], kind="stable")][:top]
    return tuple((int(i), float(logprobs[i])) for i in ids)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Over the last axis, in float64; -inf where the logit is -inf."""
    shifted = logits.astype(np.float64) - np.max(logits, axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def prompt_logprobs(rows: np.ndarray, prompt: tuple[int, ...], top: int) -> tuple[TokenLogprob, ...]:
    """Each prompt token after the first: its log-probability given the ones before it (the model's
    raw distribution, row i of `rows` predicting token i + 1), its rank there (1 + the ids more
    likely) and the `top` most likely ids there."""
    logprobs = log_softmax(rows[:-1])
    return tuple(
        TokenLogprob(token, float(row[token]), best(row, top), 1 + int((row > row[token]).sum()))
        for token, row in zip(prompt[1:], logprobs)
    )


def processed_row(logits: np.ndarray, row: PassRow, out: np.ndarray | None = None) -> np.ndarray:
    """A row (V,) as `row` has it before its filters, in float64 (into `out` where given): its grammar's mask
    (the ids it does not allow at -inf), its penalties, its bias and bans (a ban is its id's -inf bias), then
    its temperature (a greedy row's: none). A masked id stays -inf through the penalties and the bias, so the
    mask may come first here and last on a Sampler's host side. The penalties and the bias change the copy
    in place: one copy of the row, not one a step."""
    if row.allowed is not None:
        logits = np.where(unpacked(row.allowed, logits.size), logits, -np.inf)
    out = np.empty(logits.shape) if out is None else out
    np.copyto(out, logits)  # a copy: `logits` may be the runner's buffer
    if row.repetition != 1.0:
        penalize_repetition(out, row.seen, row.repetition)
    if row.presence != 0.0 or row.frequency != 0.0:
        penalize_occurrences(out, row.occurred, row.counts, row.presence, row.frequency)
    add_bias(out, row.bias)
    return np.divide(out, row.temperature, out=out) if row.temperature > 0 else out


def pick_row(logits: np.ndarray, row: PassRow, scored: bool = True) -> Pick:
    """The batched pass's pick of one row (V,) in float64: what a Sampler picks, and the pass's oracle;
    not `scored`, the token alone (its log-probability 0.0, no top ids: a request that asks for neither).
    From the few ids that decide it where it can (pick_from_few)."""
    if row.allowed is None and (few := pick_from_few(logits, row, scored)) is not None:
        return few
    return pick_whole_row(logits, row, scored)


def pick_whole_row(logits: np.ndarray, row: PassRow, scored: bool = True) -> Pick:
    """pick_row's pick by every id of the row: its definition. A draw of float32 logits that needs no
    log-probability and has no top-k nor grammar's mask goes straight from the logits to the compiled draw,
    where it runs: whole_draw.draw_logits (the same division, read as the row is, with no copy) where nothing
    but the temperature changes the row, else whole_draw.draw_processed (the ids its bans, bias and penalties
    change patched in as processed_row changes them, as the row is read)."""
    if drawn_whole(row, logits.size, scored):
        if row.bias or row.penalized:
            drawn = whole_draw.draw_processed(logits, row.temperature, row.min_p, row.top_p, row.uniform, *changes(row))
        else:
            drawn = whole_draw.draw_logits(logits, row.temperature, row.min_p, row.top_p, row.uniform)
        if drawn is not None:
            return Pick(drawn, 0.0)
    scaled = processed_row(logits, row, SCRATCH.row(logits.size))
    greedy = row.temperature == 0
    token = int(np.argmax(scaled)) if greedy else draw(scaled, row.min_p, row.top_k, row.top_p, row.uniform)
    if not scored:
        return Pick(token, 0.0)
    logprobs = log_softmax(scaled)
    return Pick(token, float(logprobs[token]), best(logprobs, row.top))


def plain_draw(row: PassRow, vocab: int) -> bool:
    """The row samples with no top-k, and nothing but its temperature and bans changes its logits (no
    grammar's mask, penalty, or bias but a ban's -inf: ignore_eos, min_tokens, suppressed ids)."""
    return row.bans_only and samples_whole(row, vocab)


def processed_draw(row: PassRow, vocab: int) -> bool:
    """The row samples with no top-k and no grammar's mask: whatever its penalties and bias change,
    whole_draw.draw_processed patches in."""
    return row.allowed is None and samples_whole(row, vocab)


def drawn_whole(row: PassRow, vocab: int, scored: bool) -> bool:
    """pick_row takes the row (of `vocab` ids) to the compiled draw over every id, where that runs: a draw with
    no top-k nor grammar's mask that asks for no log-probability (pick_whole_row's first way)."""
    return not scored and processed_draw(row, vocab)


def changes(row: PassRow) -> tuple[Any, ...]:
    """whole_draw.draw_processed's arguments after the row's draw (seen, penalty, occurred, counts, presence,
    frequency, bias ids, bias values) for what `row` changes in its logits; None for an array of what it does
    not change."""
    seen = occurred = counts = bias_ids = bias_values = None
    if row.repetition != 1.0:
        seen = np.ascontiguousarray(row.seen, np.int64)
    if row.presence != 0.0 or row.frequency != 0.0:
        occurred, counts = np.ascontiguousarray(row.occurred, np.int64), np.ascontiguousarray(row.counts, np.int64)
    if row.bias:
        bias_ids = np.fromiter((token for token, _ in row.bias), np.int64, len(row.bias))
        bias_values = np.fromiter((value for _, value in row.bias), np.float64, len(row.bias))
    return seen, row.repetition, occurred, counts, row.presence, row.frequency, bias_ids, bias_values


def samples_whole(row: PassRow, vocab: int) -> bool:
    """The row samples (a temperature above 0) with no top-k: its draw weighs every id of the row."""
    return row.temperature > 0 and not 0 < row.top_k <= vocab


def banned_copy(logits: np.ndarray, row: PassRow, out: np.ndarray) -> np.ndarray:
    """A plain draw's row (V,) as the compiled draw reads it: `logits` itself where it bans no id, else a copy
    into `out` (V,) of their dtype with its banned ids at -inf, as processed_row's bias leaves them before
    the same division (a copy: `logits` may be the runner's buffer)."""
    if not row.bias:
        return logits
    np.copyto(out, logits)
    out[[token for token, _ in row.bias]] = -np.inf
    return out


def pick_from_few(logits: np.ndarray, row: PassRow, scored: bool) -> Pick | None:
    """pick_row's very pick from the few ids that decide it (likeliest.candidates), where it has one: a top-k
    draw that asks for no log-probability (compiled where it runs and the row has no penalty and no bias but
    bans: whole_draw.top_k; else the ids its penalties and bias touch among the few, by numpy), or a greedy
    row with no penalty and no bias but bans (compiled where it runs: greedy_scored; else its log-probabilities'
    sum over the whole row in one float64 pass, as log_softmax adds it); else None."""
    if row.temperature > 0 and not scored and 0 < row.top_k < logits.size:
        if row.bans_only and logits.size >= FEW_IDS_FROM:  # compiled where it runs, else by numpy below
            head = (logits, row.temperature, row.min_p, row.top_k, row.top_p, row.uniform)
            drawn = whole_draw.top_k(*head, row.banned)
            if drawn is not None:
                return Pick(drawn, 0.0)
        touched = touched_ids(row) if row.bias or row.penalized else None
        ids = candidates(logits, row.top_k + (0 if touched is None else touched.size))
        if ids is None:
            return None
        ids = np.union1d(ids, touched) if touched is not None and touched.size else ids
        scaled = few_scaled(logits, ids, row)
        index = draw_among(scaled, logits.size, row.min_p, row.top_k, row.top_p, row.uniform)
        return None if index is None else Pick(int(ids[index]), 0.0)
    if row.temperature == 0 and scored and row.bans_only:
        if (compiled := compiled_greedy(logits, row)) is not None:
            return compiled
        banned = row.banned
        ids = candidates(logits, max(row.top, 1) + banned.size)
        if ids is None:
            return None
        processed = logits[ids].astype(np.float64)
        processed[np.isin(ids, banned)] = -np.inf
        place = int(np.argmax(processed))  # the row's first largest: every id as likely is among the few
        largest = processed[place]
        shifted = np.subtract(logits, largest, out=SCRATCH.row(logits.size))  # (V,) float64
        shifted[banned] = -np.inf
        total = np.log(np.exp(shifted, out=shifted).sum(axis=-1, keepdims=True))  # as log_softmax takes it
        logprobs = (processed - largest) - total
        top = tuple((int(ids[i]), value) for i, value in best(logprobs, row.top))
        return Pick(int(ids[place]), float(logprobs[place]), top)
    return None


def compiled_greedy(logits: np.ndarray, row: PassRow) -> Pick | None:
    """A scored greedy row's pick by whole_draw.scores (greedy_scored), where it takes the row
    (scores_compiled) and runs; else None."""
    if not scores_compiled(row) or (compiled := whole_draw.scores(logits, max(row.top, 1), row.banned)) is None:
        return None
    return greedy_scored(row, *compiled)


def greedy_scored(row: PassRow, ids: np.ndarray, values: np.ndarray, total: float) -> Pick:
    """A greedy row's pick from whole_draw.scores: its likeliest ids but the banned (descending), their
    logits, and the sum of e^(logit - the first's) over the ids not banned; log-probabilities as log_softmax
    takes them, but for that sum's order of additions (a beam's row, judged `alone`, never comes here). In
    Python's floats, the same float64 arithmetic: a handful of values, where numpy's calls cost more."""
    first, log_total = float(values[0]), math.log(total)
    logprobs = [(value - first) - log_total for value in values[: row.top].tolist()] if row.top else [-log_total]
    return Pick(int(ids[0]), logprobs[0], tuple(zip(ids[: row.top].tolist(), logprobs)))


def few_scaled(logits: np.ndarray, ids: np.ndarray, row: PassRow) -> np.ndarray:
    """processed_row of a sampling row's logits at `ids` alone (ascending, every id its bias and penalties
    touch among them), bitwise: a row with no penalty takes its bias and temperature here, without a
    PassRow of the few ids' places (on_ids)."""
    if row.penalized:
        return processed_row(logits[ids], on_ids(row, ids))
    places = [(int(np.searchsorted(ids, token)), value) for token, value in row.bias]
    scaled = add_bias(logits[ids].astype(np.float64), places)
    return np.divide(scaled, row.temperature, out=scaled)


def touched_ids(row: PassRow) -> np.ndarray:
    """The ids a row's bias and penalties change, each once, ascending."""
    if not row.penalized:  # a few biased ids: sorted here rather than by np.unique
        return np.array(sorted({token for token, _ in row.bias}), np.int64)
    parts = [np.array([token for token, _ in row.bias], np.int64)] if row.bias else []
    if row.repetition != 1.0:
        parts.append(row.seen)
    if row.presence != 0.0 or row.frequency != 0.0:
        parts.append(row.occurred)
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def on_ids(row: PassRow, ids: np.ndarray) -> PassRow:
    """`row` for the logits of `ids` alone (ascending, every id its bias and penalties touch among them): those
    ids as their places in `ids`."""
    places = np.searchsorted(ids, np.array([token for token, _ in row.bias], np.int64)).tolist()
    bias = tuple((int(place), value) for place, (_, value) in zip(places, row.bias))
    seen, occurred = (np.searchsorted(ids, touched).astype(np.int64) for touched in (row.seen, row.occurred))
    return replace(row, bias=bias, seen=seen, occurred=occurred)


@dataclass(frozen=True)
class Transform:
    """One step a Sampler takes between a row of logits and its pick, and when a request's parameters
    make it do anything (CTranslate2's LogitsProcessor). In the order they apply (vLLM's sampler and
    transformers' processors): the penalties, the bias, then the temperature and the filters, then the
    draw. A request none of them is active for picks its row's argmax: greedy's fast path."""

    name: str
    active: Callable[[SamplingParams], bool]


TRANSFORMS = (
    Transform("repetition_penalty", lambda p: p.repetition_penalty != 1.0),
    Transform("presence_and_frequency", lambda p: p.presence_penalty != 0.0 or p.frequency_penalty != 0.0),
    Transform("logit_bias", lambda p: bool(p.logit_bias)),
    Transform("temperature", lambda p: not p.greedy),
    Transform("min_p", lambda p: not p.greedy and p.min_p > 0.0),
    Transform("top_k", lambda p: not p.greedy and p.top_k > 0),
    Transform("top_p", lambda p: not p.greedy and p.top_p < 1.0),
    Transform("draw", lambda p: not p.greedy),
)
PENALTIES = frozenset({"repetition_penalty", "presence_and_frequency"})


class Sampler:
    """Picks one request's tokens from its row of logits, one step at a time."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids: tuple[int, ...] = ()):
        self.params = params
        self.seed = params.seed if params.seed is not None else secrets.randbits(64)
        self.position = 0  # tokens taken so far: the next draw's counter
        self.vocab_size = vocab_size
        self.active = tuple(t.name for t in TRANSFORMS if t.active(params))  # the transforms it applies
        self.penalized = not PENALTIES.isdisjoint(self.active)
        # kept for the penalties alone: the prompt's and completion's ids; the completion's, with their counts
        seen = tuple(i for i in prompt_ids if 0 <= i < vocab_size) if self.penalized else ()
        self.seen, self.occurred = Occurrences(seen), Occurrences()
        self.banned: tuple[int, ...] | None = None  # the bans of pass_row's last bias
        self.bias: tuple[tuple[int, float], ...] = ()  # the logit bias and those bans at -inf

    @property
    def plain_greedy(self) -> bool:
        """No transform active (greedy with no penalty and no bias): the token is the row's argmax, which
        the engine takes for the whole batch at once (`seen` and `occurred` then matter to nobody)."""
        return not self.active

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
        return token, TokenLogprob(token, float(logprobs[token]), best(logprobs, top))

    def pass_row(self, banned: tuple[int, ...], top: int) -> PassRow | None:
        """This step's pick as the batched pass makes it (the same steps as processed() and take() with no
        mask), or None where the pass's float32 could overflow: a repetition penalty below
        MIN_PASSED_PENALTY (the host's float64 does not)."""
        p = self.params
        if p.repetition_penalty < MIN_PASSED_PENALTY:
            return None
        if banned is not self.banned:  # a Sequence's bans change once (min_new_tokens): the bias is kept
            self.banned, self.bias = banned, p.logit_bias + tuple((token, -np.inf) for token in banned)
        row = PassRow(p.temperature, p.top_k, p.top_p, p.min_p, self.uniform_at(self.position), self.bias, top)
        if not self.penalized:
            return row
        seen = self.seen.ids if p.repetition_penalty != 1.0 else row.seen
        return replace(
            row,
            repetition=p.repetition_penalty,
            presence=p.presence_penalty,
            frequency=p.frequency_penalty,
            seen=seen,
            occurred=self.occurred.ids,
            counts=self.occurred.counts,
        )

    def uniform(self) -> float:
        """This step's uniform number (unused by greedy, drawn all the same: stateless)."""
        return counter_uniform(self.seed, self.position)

    def uniform_at(self, position: int) -> float:
        """The uniform number of the draw at `position` (a burst's later steps, ahead of this one); 0 for
        greedy, as pass_row's."""
        return 0.0 if self.params.greedy else counter_uniform(self.seed, position)

    def processed(self, logits: np.ndarray, banned: tuple[int, ...], allowed: np.ndarray | None = None) -> np.ndarray:
        """The row a token is picked from: the penalties (repetition, then presence and frequency), the
        bias, the ban and the mask, then (sampling) the temperature."""
        p, active = self.params, self.active
        if "repetition_penalty" in active:
            logits = apply_repetition_penalty(logits, self.seen.ids, p.repetition_penalty)
        if "presence_and_frequency" in active:
            o = self.occurred
            logits = apply_occurrence_penalties(logits, o.ids, o.counts, p.presence_penalty, p.frequency_penalty)
        if p.logit_bias or banned:
            logits = bias_and_ban(logits, p.logit_bias, banned)
        if allowed is not None:
            logits = np.where(allowed, logits, -np.inf)
        return logits if p.greedy else logits.astype(np.float64) / p.temperature

    def take(self, processed: np.ndarray) -> int:
        """Greedy argmax, or a draw after min-p, top-k and top-p; the token is remembered for the penalties."""
        p = self.params
        token = int(np.argmax(processed)) if p.greedy else draw(processed, p.min_p, p.top_k, p.top_p, self.uniform())
        self.record(token)
        return token

    def record(self, token: int) -> None:
        """`token` was taken (here or by the batched pass): for the penalties and the next draw's counter."""
        if self.penalized and 0 <= token < self.vocab_size:
            self.seen.add(token)
            self.occurred.add(token)
        self.position += 1
