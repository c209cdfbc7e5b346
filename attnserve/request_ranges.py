"""A range of a request field's values that needs no model, and the bounds the ranges are made of.
Each field's range is in the table of request fields (attnserve/request_fields.py), read on both
sides of the wire: the server's validation checks them before anything else
(server/session/validation.py), and `attnserve generate` and `bench` check their flags against them
before a request is sent, in the same words ("top_p: 2 is outside (0, 1]"). A range that the model
or the server's flags narrow (the max_new_tokens cap, vocab_size, the batch's slots) says so; the
server checks those fields against its narrower bounds instead, in its own words. Standard library
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
