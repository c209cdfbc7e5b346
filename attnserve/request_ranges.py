"""The ranges of a request's fields that need no model, written once and read on both sides of the
wire: the server's validation checks them before anything else (server/session/validation.py), and
`attnserve generate` and `bench` check their flags against them before a request is sent, in the
same words ("top_p: 2 is outside (0, 1]"). A range that the model or the server's flags narrow (the
max_new_tokens cap, vocab_size, the batch's slots) says so; the server checks those fields against
its narrower bounds instead, in its own words. A list's range is each element's. Standard library
only: client hosts import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT32_MAX = 2**32 - 1
MAX_STREAM_INTERVAL_MS = 60_000  # a stream's longest time bound between messages
MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's bound)
MAX_N = 16  # completions per request (the server's batch narrows it)
MAX_BIAS = 100.0  # a logit_bias value's bound either way (OpenAI's)
MAX_LENGTH_PENALTY = 10.0  # a beam search's length_penalty either way


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    low_open: bool = False  # (low, high] rather than [low, high]
    narrowed: str = ""  # what narrows it on the server (the model, a flag), whose own check is then the one there

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{number(self.low)}, {number(self.high)}]"

    def problem(self, value: float) -> str | None:
        """None if `value` is inside, else "<value> is outside <the interval><note>"."""
        above_low = value > self.low if self.low_open else value >= self.low
        if math.isfinite(value) and above_low and value <= self.high:
            return None
        return f"{number(value)} is outside {self}" + (f" ({self.narrowed} narrows it)" if self.narrowed else "")


def number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


TOKEN_ID = Range(0, INT32_MAX, narrowed="the model's vocab_size")
# attnserve.v1's field names (GenerateRequest): the range of each, or of each element of a list
RANGES: dict[str, Range] = {
    "max_new_tokens": Range(0, INT32_MAX, narrowed="the server's cap"),
    "temperature": Range(0.0, 100.0),
    "top_k": Range(0, INT32_MAX, narrowed="the model's vocab_size"),  # 0 keeps all
    "top_p": Range(0.0, 1.0, low_open=True),
    "repetition_penalty": Range(0.0, 100.0, low_open=True),
    "seed": Range(0, 2**64 - 1),
    "prompt_token_ids": TOKEN_ID,
    "stop_token_ids": TOKEN_ID,
    "stream_interval_tokens": Range(1, UINT32_MAX, narrowed="the server's max_new_tokens cap"),
    "stream_interval_ms": Range(0, MAX_STREAM_INTERVAL_MS),
    "min_new_tokens": Range(0, UINT32_MAX),
    "logit_bias": Range(-MAX_BIAS, MAX_BIAS),  # each bias; its ids are token ids
    "priority": Range(INT32_MIN, INT32_MAX),
    "logprobs": Range(0, MAX_LOGPROBS),
    "prompt_logprobs": Range(0, MAX_LOGPROBS),
    "n": Range(1, MAX_N, narrowed="the server's --max-batch"),
    "num_beams": Range(1, MAX_N, narrowed="the server's --max-batch"),
    "length_penalty": Range(-MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY),
    "num_return_sequences": Range(1, MAX_N, narrowed="num_beams"),
}


def problems(name: str, value: object) -> list[tuple[str, str]]:
    """(field, problem) for `value` of field `name` outside RANGES: one for a number, one per element
    of a list (field[i]) or per logit_bias entry (field[id]); none when all is inside or `name` has no range."""
    bound = RANGES.get(name)
    if bound is None or value is None:
        return []
    if isinstance(value, dict):
        found = [(f"{name}[{token}]", TOKEN_ID.problem(token)) for token in value]
        found += [(f"{name}[{token}]", bound.problem(bias)) for token, bias in value.items()]
    elif isinstance(value, (list, tuple)):
        found = [(f"{name}[{i}]", bound.problem(item)) for i, item in enumerate(value)]
    else:
        found = [(name, bound.problem(value))]  # type: ignore[arg-type]  # a number
    return [(where, problem) for where, problem in found if problem is not None]
