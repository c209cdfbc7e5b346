"""Speculative decoding: a request's next tokens proposed from its own history (prompt lookup, here) or
by a draft model (drafting.py), checked by the model in one run, the longest right prefix kept.

A request whose last n ids (prompt_lookup_max down to prompt_lookup_min of them) occurred before in its
prompt or its output proposes the ids that followed their latest earlier occurrence, up to
num_speculative_tokens (vLLM's n-gram method, transformers' prompt_lookup_num_tokens). The runner feeds
the request's next token and the proposals as one chunk and brings back the model's argmax after each,
or a sampling request's rows (SlotRunner.verify): a proposal is kept while it equals the token the
request picks from the row before it (its argmax, or its sampler's seeded draw), and the pick after the
last kept one is one more token, so a step gives 1 to k + 1 tokens, each the one decoding without
speculation picks (up to the last bits of a run of several positions against a run of one:
export/invariance.py). For a proposal of one id this is rejection sampling (Leviathan et al., 2023):
kept with the target's probability of it, a rejected one replaced by a draw from the target without
it; so a sampled request keeps its distribution, and a seeded one its tokens (engine._decode_speculated).
A draft model's proposals are its greedy ids, one id each too. A request whose proposals keep failing
(or whose verifications give fewer tokens a second than plain steps: step_costs.py) stops proposing
for a while, doubling each time (Lookup.record), so a workload that repeats nothing decodes in the
usual greedy bursts.
Parsed from `--speculative-config`'s JSON as vLLM's; no runner, no ONNX Runtime here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

NGRAM = "ngram"
DRAFT_MODEL = "draft_model"
METHODS = (NGRAM, DRAFT_MODEL)
MAX_SPECULATIVE_TOKENS = 16  # proposals one step checks, at most
MAX_LOOKUP = 16  # the longest n-gram looked up
KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size")
NUMBERS = ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size")
MISSES = 2  # verifications in a row that keep nothing (or do not pay) before a request pauses its proposals
FIRST_PAUSE = 8  # decode steps of the first pause; each pause after another miss is twice the last
LONGEST_PAUSE = 256


@dataclass(frozen=True)
class Speculation:
    """`--speculative-config`: proposals of `num_speculative_tokens` ids by looking up the last
    `prompt_lookup_max` down to `prompt_lookup_min` ids in the request's history (method ngram), or by
    as many greedy steps of a draft `model` (an exported model directory with the target's tokenizer:
    method draft_model, drafting.py), while at most `disable_by_batch_size` requests decode (each
    speculating request runs alone: ONNX Runtime's GroupQueryAttention takes several new positions
    with a past for one sequence a run only)."""

    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    disable_by_batch_size: int = 1
    method: str = NGRAM
    model: str | None = None  # the draft model's directory (method draft_model)


def parse_speculation(text: str) -> Speculation:
    """`--speculative-config`'s JSON object; ValueError with one line naming the key and its limit."""
    try:
        given = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--speculative-config must be a JSON object: {error}") from None
    if not isinstance(given, dict):
        raise ValueError('--speculative-config must be a JSON object, e.g. \'{"method": "ngram"}\'')
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise ValueError(f"--speculative-config: unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)}")
    method, model = method_and_model(given)
    numbers: dict[str, int] = {}
    for key in NUMBERS:
        value = given.get(key)  # null: the default, as absent
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"--speculative-config: {key} must be a whole number, not {value!r}")
        if value is not None:
            numbers[key] = value
    lookup_max = numbers.get("prompt_lookup_max", numbers.get("prompt_lookup_min", Speculation.prompt_lookup_max))
    speculation = Speculation(
        num_speculative_tokens=numbers.get("num_speculative_tokens", Speculation.num_speculative_tokens),
        prompt_lookup_max=lookup_max,
        prompt_lookup_min=numbers.get("prompt_lookup_min", min(Speculation.prompt_lookup_min, lookup_max)),
        disable_by_batch_size=numbers.get("disable_by_batch_size", Speculation.disable_by_batch_size),
        method=method,
        model=model,
    )
    checks = (
        (
            "num_speculative_tokens",
            1 <= speculation.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS,
            f"1 to {MAX_SPECULATIVE_TOKENS}",
        ),
        ("prompt_lookup_max", 1 <= speculation.prompt_lookup_max <= MAX_LOOKUP, f"1 to {MAX_LOOKUP}"),
        (
            "prompt_lookup_min",
            1 <= speculation.prompt_lookup_min <= speculation.prompt_lookup_max,
            f"1 to prompt_lookup_max ({speculation.prompt_lookup_max})",
        ),
        ("disable_by_batch_size", speculation.disable_by_batch_size >= 1, "at least 1"),
    )
    for key, ok, limit in checks:
        if not ok:
            raise ValueError(f"--speculative-config: {key} must be {limit}, not {getattr(speculation, key)}")
    return speculation


def method_and_model(given: dict) -> tuple[str, str | None]:
    """A config's method (ngram, or draft_model where it names a model) and its draft model's directory;
    ValueError with one line where they do not go together."""
    model = given.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ValueError(f"--speculative-config: model must be a model directory's path, not {model!r}")
    method = given.get("method", NGRAM if model is None else DRAFT_MODEL)
    if method not in METHODS:
        raise ValueError(
            f"--speculative-config: method must be {NGRAM!r} (prompt lookup) or {DRAFT_MODEL!r} (with a "
            f"model), not {method!r}"
        )
    if (method == DRAFT_MODEL) != (model is not None):
        raise ValueError(f"--speculative-config: a model goes with method {DRAFT_MODEL!r}, and only with it")
    lookups = [key for key in ("prompt_lookup_max", "prompt_lookup_min") if given.get(key) is not None]
    if model is not None and lookups:
        raise ValueError(f"--speculative-config: {lookups[0]} is for method {NGRAM!r}, not a draft model")
    return method, model


class Lookup:
    """One request's history (decoder prompt and output) indexed by its n-grams, and whether it
    proposes now (with a draft model, the history the draft's slot follows, and the same pauses)."""

    def __init__(
        self, speculation: Speculation, history: tuple[int, ...], next_pause: int = FIRST_PAUSE, pause: int = 0
    ):
        """`next_pause`: the pause its first misses bring; `pause`: the steps it waits before it first
        proposes (with a draft model, the engine's: what the last request left of them at its end)."""
        self.speculation = speculation
        self.sizes = range(speculation.prompt_lookup_max, speculation.prompt_lookup_min - 1, -1)
        self.tokens: list[int] = list(history)
        self.follows: dict[tuple[int, ...], int] = {}  # n-gram -> where the id after its latest occurrence is
        self.indexed = 0  # the ids `follows` has seen: it is brought up to date when asked (a request
        # in a batch too large to speculate pays a list append a token, not its n-grams)
        self.misses = 0  # verifications in a row that kept no proposal or did not pay
        self.pause = pause  # decode steps left before it proposes again
        self.next_pause = next_pause
        self.proposed = 0  # ids proposed and kept, for the request's metrics
        self.accepted = 0

    def append(self, token: int) -> None:
        """The history's next id."""
        self.tokens.append(token)

    def index(self) -> None:
        """Every n-gram of the history followed by an id, at its latest occurrence."""
        tokens, follows = self.tokens, self.follows
        for end in range(self.indexed, len(tokens)):
            for n in self.sizes:
                if n <= end:
                    follows[tuple(tokens[end - n : end])] = end
        self.indexed = len(tokens)

    def propose(self, most: int) -> tuple[int, ...]:
        """`most` ids (at most num_speculative_tokens) that followed the longest of the history's last
        n-grams where it occurred last before; where those run into the history's end (a repeating
        stretch, `period` ids long, that goes on), the ids the stretch repeats. () while paused or where
        none occurred."""
        most = min(most, self.speculation.num_speculative_tokens)
        if self.pause or most < 1:
            return ()
        self.index()
        for n in self.sizes:
            if n <= len(self.tokens):
                start = self.follows.get(tuple(self.tokens[-n:]))
                if start is not None:
                    period = len(self.tokens) - start
                    return tuple(self.tokens[start + i % period] for i in range(most))
        return ()

    def record(self, proposed: int, accepted: int, paid: bool | None = None) -> None:
        """A verification kept `accepted` of `proposed` ids, and (`paid`) gave at least as many tokens as
        plain steps would have in its time (step_costs.py; None: not known); MISSES in a row that kept
        none or did not pay pause the proposals, for twice as long as the last pause."""
        self.proposed += proposed
        self.accepted += accepted
        if accepted and paid is not False:
            self.misses, self.next_pause = 0, FIRST_PAUSE
            return
        self.misses += 1
        if self.misses >= MISSES:
            self.pause, self.misses = self.next_pause, 0
            self.next_pause = min(2 * self.next_pause, LONGEST_PAUSE)

    def passed(self, steps: int) -> None:
        """`steps` decode steps ran without it proposing."""
        self.pause = max(0, self.pause - steps)
