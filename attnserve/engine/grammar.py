"""Structured output: a JSON schema or a regular expression as a grammar over the model's tokens, and
the matcher that tells a request's sampler which ids may come next.

llguidance (the library vLLM, SGLang and llama.cpp adopted) compiles the grammar lazily against the
tokenizer's token bytes: no per-vocabulary precomputation at compile time (0.5 ms for a typed
object here), a mask in 8-18 us a step at these vocabularies, and one-line-ish errors for a bad
schema or pattern. The front end compiles and checks each request's grammar (`compile_grammar`); the
engine runs one `Matcher` per constrained completion. Knows nothing of gRPC, ONNX Runtime or devices.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from ..tokenizer import Tokenizer
from .domain import Grammar

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

KINDS = ("json_schema", "regex")
# JSON output without whitespace between tokens: the model spends no steps on indentation, and a model
# never trained on JSON cannot wander into endless runs of spaces (llguidance's default allows them).
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """The schema or pattern does not compile: the message says why, on one line."""


_SPACES: dict[int, tuple[Tokenizer, llguidance.LLTokenizer]] = {}  # id(tokenizer) -> it (kept alive), its space


def token_space(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer`'s ids: a BPE's tokenizer.json as it is, the byte tokenizer's
    256 bytes and its three special ids. Built once per tokenizer (6 ms for 2,048 BPE ids)."""
    held = _SPACES.get(id(tokenizer))
    if held is None:
        held = _SPACES[id(tokenizer)] = (tokenizer, space_of(tokenizer))
    return held[1]


def space_of(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    if tokenizer.kind == "bpe":
        spec = tokenizer.state()["json"]
        return llguidance.LLTokenizer(spec, n_vocab=tokenizer.vocab_size, eos_token=tokenizer.eos_id)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteIds(tokenizer)), eos_token=tokenizer.eos_id)


class _ByteIds:
    """What llguidance's TokenizerWrapper reads of a byte-level tokenizer: each id's bytes."""

    def __init__(self, tokenizer: Tokenizer):
        self.eos_token_id, self.bos_token_id = tokenizer.eos_id, tokenizer.bos_id
        self.special_token_ids = list(range(256, tokenizer.vocab_size))
        self.tokens = [bytes([i]) for i in range(256)] + [f"<special {i}>".encode() for i in self.special_token_ids]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def one_line(message: str) -> str:
    """llguidance's message without its source excerpt (the lines from `   1 | ` on), on one line."""
    lines = []
    for line in message.strip().splitlines():
        if re.match(r"\s*\d+ \|", line):
            break
        lines.append(line.strip())
    return " ".join(part for part in lines if part and part != "^")


def compile_grammar(kind: str, source: str, tokenizer: Tokenizer) -> Grammar:
    """The grammar for a JSON schema (its JSON text) or a regular expression, checked against the
    tokenizer; GrammarError says what is wrong with it."""
    if kind == "json_schema":
        try:
            schema = json.loads(source)
        except ValueError as e:
            raise GrammarError(f"not JSON: {e}") from None
        except RecursionError:
            raise GrammarError("JSON nested too deep") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"a schema is a JSON object, not {type(schema).__name__}")
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    elif kind == "regex":
        text = llguidance.LLMatcher.grammar_from_regex(source)
    else:
        raise GrammarError(f"{kind!r} is not one of {KINDS}")
    problem = llguidance.LLMatcher.validate_grammar(text, token_space(tokenizer))
    if problem:
        raise GrammarError(one_line(problem))
    return Grammar(kind, text)


class Matcher:
    """One completion's place in its grammar: which ids may come next, and the ids taken so far."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer):
        self.matcher = llguidance.LLMatcher(token_space(tokenizer), grammar.text, log_level=0)
        self.vocab_size = tokenizer.vocab_size
        self.bitmask = allocate_token_bitmask(1, self.vocab_size)
        self.stopped = False  # is_stopped() after the last token taken (complete)

    def allowed(self) -> np.ndarray:
        """Which ids may come next (EOS only once the text so far is complete), packed: int32 words, bit i
        of word j for id 32j + i (llguidance's layout; sampling.unpacked makes a bool per id of it). A copy."""
        fill_next_token_bitmask(self.matcher, self.bitmask)
        return self.bitmask[0].copy()

    def take(self, token: int) -> None:
        """The id generated; it was allowed (the engine masks the others)."""
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}: {one_line(self.matcher.get_error())}")
        self.stopped = self.matcher.is_stopped()  # now, before ahead() lends the matcher to the mask thread

    def ahead(self) -> Future[np.ndarray]:
        """allowed(), computed by the mask thread while the engine thread runs the model (8-18 us)."""
        if not _MASKS:
            _MASKS.append(ThreadPoolExecutor(1, thread_name_prefix="attnserve-masks"))
        return _MASKS[0].submit(self.allowed)

    @property
    def complete(self) -> bool:
        """The output is whole and the grammar allows nothing more after it: as of the last token taken,
        never asked of the matcher itself, which the mask thread may hold then (llguidance's matcher is
        borrowed mutably while it fills a mask: asking it then raised "Already mutably borrowed")."""
        return self.stopped


_MASKS: list[ThreadPoolExecutor] = []  # the mask thread, started on first use
