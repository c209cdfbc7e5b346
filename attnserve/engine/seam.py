"""The engine's seam: what the scheduler may know of a model (ModelSpec) and what it asks of the
thing that runs it (SlotRunner). Knows nothing of ONNX Runtime, sessions, KV layouts or devices.

The engine holds request keys, token ids and logits; a SlotRunner holds every tensor. The
arena runner (arena_runner.py) serves model directories, the concat runner is the KV
benchmark's baseline, and tests/test_engine.py drives the real engine over a fake runner with
deterministic logits.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from . import whole_draw


@dataclass(frozen=True)
class ModelSpec:
    """The facts of a model the scheduler needs: sizes for sampling and budgets, and where decoding starts."""

    vocab_size: int  # V: the width of every row of logits
    context_length: int  # positions a sequence may fill, prompt and completion together
    bos_id: int  # an encoder-decoder's decoder starts from it
    encoder_decoder: bool = False  # True: a prompt is a source to encode, not the decoder's prefix

    def decoder_prompt(self, prompt_ids: tuple[int, ...]) -> tuple[int, ...]:
        """The tokens the decoder starts from: the prompt, or an encoder-decoder's BOS."""
        return (self.bos_id,) if self.encoder_decoder else prompt_ids


@dataclass(frozen=True)
class PrefixReport:
    """A runner's prefix cache in one prefill round: its lookups (one per prompt whose prefill began)
    and what it holds after the round, for metrics."""

    hits: int = 0  # prompts that found a cached prefix
    misses: int = 0  # prompts that found none
    saved: int = 0  # prompt tokens copied from the cache instead of prefilled
    held_bytes: int = 0  # bytes of cached prefixes after the round


def no_ids() -> np.ndarray:
    return np.empty(0, np.int64)


PASS_TOP = 20  # the most top ids a batched logits pass brings back for a row (PassRow.top)
# from this many ids up, the host picks a top-k draw or a greedy row's top ids from the few ids that decide it
# (likeliest.py; below, a pick over the whole row costs less): what the host's pick costs a runner's pass prices
FEW_IDS_FROM = 8192


def compiled_draw() -> bool:
    """Whether the host draws a sampled row with no top-k by the compiled draw (whole_draw.py), which costs less
    than numpy's: a runner's pass prices the host's picks by it."""
    return whole_draw.available()


def scores_compiled(row: PassRow) -> bool:
    """Whether the host scores `row` by the compiled library (whole_draw.scores: sampling.compiled_greedy) where
    it runs: a greedy row with no grammar's mask, no penalty, no bias but bans, and not a beam's (judged `alone`:
    its log-probabilities must be log_softmax's)."""
    return row.bans_only and row.temperature == 0 and not row.alone


@dataclass(frozen=True)
class PassRow:
    """What the batched logits pass does to one row (a Sampler's pick with no grammar's mask): divide the
    logits of the `seen` ids by `repetition` (multiply where negative), subtract `frequency` times each
    of the `occurred` ids' `counts` and `presence` once, add `bias` (sparse; a banned id's is -inf),
    divide by `temperature` (0: greedy, the row's argmax), keep by `min_p` (0: off), `top_k` (0: off) and
    `top_p` (1: off), then draw with `uniform` in [0, 1) (sampling.draw); the token's log-probability
    comes back, and the `top` likeliest ids' too (at most PASS_TOP). With `alone`, whether the pass or the
    host picks the row may depend on the row alone, never on what shares its batch (a beam's scores: the
    two sides' float32 log-softmaxes may part in the last bit). With `allowed` (a grammar's mask: int32
    words, bit i of word j for id 32j + i), every other id is -inf first. The id arrays may be views of
    the Sampler's: read them before it takes its next token."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    uniform: float
    bias: tuple[tuple[int, float], ...] = ()
    top: int = 0
    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0
    seen: np.ndarray = field(default_factory=no_ids, compare=False)  # the prompt's and completion's, once
    occurred: np.ndarray = field(default_factory=no_ids, compare=False)  # the completion's, once each
    counts: np.ndarray = field(default_factory=no_ids, compare=False)  # how often each occurred
    alone: bool = False
    allowed: np.ndarray | None = field(default=None, compare=False)  # a grammar's mask, packed

    @property
    def penalized(self) -> bool:
        """Any of the repetition, presence and frequency penalties applies."""
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0

    @functools.cached_property
    def banned(self) -> np.ndarray:
        """The ids it bans (their -inf bias), ascending int64, each once; found at the first asking, and
        carried by at_step's copies."""
        return np.array(sorted({token for token, value in self.bias if value == -np.inf}), np.int64)

    @property
    def bans_only(self) -> bool:
        """Nothing changes the row's logits but bans: no grammar's mask, no penalty, and no bias but a ban's
        -inf (ignore_eos, min_tokens, suppressed ids)."""
        plain = self.allowed is None and not self.penalized
        return plain and all(value == -np.inf for _, value in self.bias)

    def at_step(self, uniform: float, **penalized: np.ndarray) -> PassRow:
        """This row with another uniform number, and the `seen`, `occurred` and `counts` given (a burst's
        later step): its fields copied as they are, not through __init__ (0.4 us against
        dataclasses.replace's 3.4: a burst makes one a row a step)."""
        row = object.__new__(PassRow)
        row.__dict__.update(self.__dict__, uniform=uniform, **penalized)
        return row


@dataclass(frozen=True)
class Pick:
    """A row picked by a runner's batched pass: its token, the token's log-probability under the processed
    distribution (after the bias and the temperature), and the likeliest ids with theirs (at least as
    many as its PassRow's `top`, descending, lower id first on ties)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Logits:
    """One run's rows of logits by request key: `keys[i]`'s row is `rows[i]`, rows (n, V) float32.

    One array for the batch, so that the engine picks every greedy row's token with one argmax. The
    rows may be a view of the runner's output buffer: valid until the runner's next call. A decode
    told which keys sample may bring back `tokens` (n,), each row's argmax (first index on ties),
    and then only the sampling keys' rows are valid. A prefill brings back `prompts` for the keys started
    with prompt_logits: every position's logits of the prompt (n, V) float32, row i predicting token i + 1.
    A runner with a prefix cache says, for the keys whose prompt completed, how many of its tokens
    came from the cache (`cached`), and what its cache did this round (`prefix`). A decode told which
    sampling keys its batched pass may pick (`passes`) brings back `picks` for those it picked; the
    row of every other sampling key is valid."""

    keys: list[int]
    rows: np.ndarray
    tokens: np.ndarray | None = None
    prompts: dict[int, np.ndarray] = field(default_factory=dict)  # key -> its whole prompt's logits (n, V)
    cached: dict[int, int] = field(default_factory=dict)  # key -> prompt tokens served from the prefix cache
    prefix: PrefixReport | None = None  # None: the runner has no prefix cache
    picks: dict[int, Pick] = field(default_factory=dict)  # key -> its row picked by the runner's pass

    @classmethod
    def of(cls, rows: Mapping[int, np.ndarray]) -> Logits:
        """From rows (V,) by key (stacked: a copy)."""
        keys = list(rows)
        width = next(iter(rows.values())).shape[-1] if rows else 0
        return cls(keys, np.stack([rows[k] for k in keys]) if keys else np.empty((0, width), np.float32))


@dataclass(frozen=True)
class Verified:
    """A verification's outcome (SlotRunner.verify), by key: the argmax after each id it was fed (its next
    token, then each proposal), or for a key it was told samples, the rows of logits (T, V) float32 after
    each (a copy), from which the engine picks as it picks a step's row."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    rows: dict[int, np.ndarray] = field(default_factory=dict)


Enough = Callable[[list[int], np.ndarray], bool]  # told a step's keys and their tokens (n,): does the burst end?
Bans = Mapping[int, tuple[int, ...]]  # key -> the ids its greedy token must not be (a burst's ignore_eos rows)


class Draws(Protocol):
    """A burst's rows that are picked by a PassRow (sampling, logprobs, a bias, penalties), each step's
    differing from the step before's by its uniform number and its penalties' ids alone (burst.BurstDraws):
    what the runner asks of them."""

    def rows(self, step: int) -> dict[int, PassRow]:
        """Key -> its PassRow at the burst's `step` (0: its first)."""
        ...

    def pick_on_host(self, step: int, logits: Mapping[int, np.ndarray], rows: Mapping[int, PassRow]) -> dict[int, Pick]:
        """Each key's pick at `step` by its PassRow there (`rows`) from its row of logits (V,) float32 (`logits`),
        on the host, together (the rows the pass did not pick)."""
        ...

    def took(self, step: int, picks: dict[int, Pick]) -> None:
        """Every drawn key's pick at `step` (called once a step, in order, before the step's tokens are
        handed to the burst's Enough)."""
        ...


def argmax_without(row: np.ndarray, banned: tuple[int, ...]) -> int:
    """The argmax of `row` (V,) over every id but `banned` (first index on ties), as a greedy pick whose
    only transform is a ban makes it (sampling.Sampler's, and the pass's, with only -inf biases)."""
    values = np.array(row, np.float32)
    values[list(banned)] = -np.inf
    return int(values.argmax())


def greedy_tokens(logits: Logits, bans: Bans) -> np.ndarray:
    """Each row's greedy token (n,) from rows that all came back (a runner that brings back no tokens):
    its argmax, or for a key in `bans` its argmax over every id but those."""
    tokens = logits.rows.argmax(axis=1)
    for row, key in enumerate(logits.keys):
        if key in bans:
            tokens[row] = argmax_without(logits.rows[row], bans[key])
    return tokens


class SlotRunner(Protocol):
    """Requests by key in a fixed number of slots: prompts in, rows of logits (V,) out.

    The engine calls it from one thread only. `start` reserves a slot (never more than
    free_slots(), one for it and one per fork; with `prompt_logits` its prompt's every position comes back
    too; once its prompt is prefilled, each fork key gets a copy of its state and its last-token logits:
    n completions of one prompt, prefilled once); `prefill` runs one
    round of prompt work and returns the logits of the last token of every prompt it completed (a long
    prompt may take several rounds); `decode` feeds one
    token per decoding key and returns its next logits (given `sampled`, the keys that sample, the
    others are picked by argmax and the runner may return their tokens instead of their logits; given
    `passes`, some sampling keys' PassRows, the runner may pick those rows itself, in one batched pass
    where the logits are, and return Picks instead of their rows; given `bans` beside `sampled`, each
    of those keys' token comes back as its argmax over every id but its bans: argmax_without, its row
    read only where its argmax is banned);
    `decode_steps` runs up to `steps` decode steps of argmax tokens back to back, each fed the
    tokens the step before picked, handing each step's keys and tokens to `enough` until it says the
    burst ends (the steps run come back); a key in `bans` takes the argmax over every id but its bans
    (argmax_without: the row is read only at a step whose argmax is banned); with `ahead`, a runner that
    can runs each step but the last while `enough` looks at the one before (run-ahead, with a one-step
    lag: where `enough` says the burst ends, the step after has run, and is handed to `enough` too, its
    answer not asked, and counted; a runner that cannot ignores it: chain_steps); `verify` feeds each
    decoding key its next token and, for a key in `proposals`, the ids it proposes after it, and brings
    back each key's argmax after every id it was fed (1 + its proposals' ids, in order: a run of
    several positions), or for a key in `sampled` its rows of logits after each, its slot holding them
    all (Verified); `rewind` forgets a key's last `count` positions
    (the proposals the engine did not keep); `copy_cache` gives one
    key's slot a copy of another's cache (a beam that continues another beam: the positions and the
    self-attention keys and values; an encoder-decoder's source keys and values are the same in both
    and stay); `release` frees a key's slot; `reset` frees every slot after a failed run."""

    spec: ModelSpec

    def free_slots(self) -> int: ...
    def start(
        self, key: int, prompt: tuple[int, ...], prompt_logits: bool = False, forks: tuple[int, ...] = ()
    ) -> None: ...
    def prefill(self) -> Logits: ...
    def decode(
        self,
        next_ids: dict[int, int],
        sampled: frozenset[int] | None = None,
        passes: Mapping[int, PassRow] | None = None,
        bans: Bans | None = None,
    ) -> Logits: ...
    def decode_steps(
        self,
        next_ids: dict[int, int],
        steps: int,
        enough: Enough,
        bans: Bans | None = None,
        ahead: bool = False,
        draws: Draws | None = None,
    ) -> int: ...
    def verify(
        self, next_ids: dict[int, int], proposals: Mapping[int, tuple[int, ...]], sampled: frozenset[int] = frozenset()
    ) -> Verified: ...
    def rewind(self, key: int, count: int) -> None: ...
    def copy_cache(self, src: int, dst: int) -> None: ...
    def release(self, key: int) -> None: ...
    def reset(self) -> None: ...


def chain_steps(
    keys: list[int],
    tokens: np.ndarray,
    steps: int,
    enough: Enough,
    step: Callable[[np.ndarray], np.ndarray],
    ahead: bool = False,
) -> int:
    """decode_steps' loop on one thread: `tokens`, the first step's, to `enough`, then each next step's,
    `step(tokens)` fed the last (never writing them), until `enough` says the burst ends or `steps`
    ran; the steps run. With `ahead`, in a run-ahead runner's order (runtime/run_ahead.py runs the steps
    on a thread of its own): each step but the last runs before `enough` sees the one before, and where
    `enough` says the burst ends, the step already run is handed to it too, its answer not asked, and
    counted (SlotRunner's one-step lag)."""
    for ran in range(1, steps + 1):
        if not ahead or ran == steps:
            if enough(keys, tokens) or ran == steps:
                return ran
            tokens = step(tokens)
            continue
        after = step(tokens)
        if enough(keys, tokens):
            enough(keys, after)
            return ran + 1
        tokens = after
    return steps


def drawn(logits: Logits, rows: Mapping[int, PassRow], draws: Draws, step: int, tokens: np.ndarray) -> np.ndarray:
    """`tokens` (the step's argmax tokens, by row of `logits`) with each drawn key's (a key of `rows`, its
    PassRows at `step`) its pick's: the runner's pass's, or on the host Draws.pick_on_host's from its row (those
    rows together); the picks handed to Draws.took."""
    host = {key: logits.rows[i] for i, key in enumerate(logits.keys) if key in rows and key not in logits.picks}
    on_host = draws.pick_on_host(step, host, {key: rows[key] for key in host}) if host else {}
    picks: dict[int, Pick] = {}
    for index, key in enumerate(logits.keys):
        if key in rows:
            pick = logits.picks[key] if key in logits.picks else on_host[key]
            tokens[index], picks[key] = pick.token, pick
    draws.took(step, picks)
    return tokens


def stepwise(
    runner: SlotRunner,
    next_ids: dict[int, int],
    steps: int,
    enough: Enough,
    bans: Bans | None = None,
    ahead: bool = False,
    draws: Draws | None = None,
) -> int:
    """decode_steps by one decode() call per step: for a runner with no faster way to chain them; with
    `ahead`, in a run-ahead runner's order (chain_steps), each step run before the one before is seen."""
    keys: list[int] = []
    ran = itertools.count()

    def step(tokens: np.ndarray | None) -> np.ndarray:
        fed = next_ids if tokens is None else dict(zip(keys, tokens.tolist()))
        index = next(ran)
        rows = draws.rows(index) if draws is not None else {}
        logits = runner.decode(fed, frozenset(rows), rows, bans)
        keys[:] = logits.keys
        picked = greedy_tokens(logits, bans or {}) if logits.tokens is None else logits.tokens
        return drawn(logits, rows, draws, index, picked.copy()) if draws is not None else picked

    first = step(None)
    return chain_steps(keys, first, steps, enough, step, ahead)
