"""Plain domain objects the server passes between its layers: requests, events, errors.

No protobuf and no gRPC here: validation turns a GenerateRequest into a GenerationRequest,
the engine answers with Delta and Final events, and the servicer turns those back into
protobuf. Errors carry what went wrong; the interceptor maps each class to a status code once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FinishReason(str, enum.Enum):
    """Why a completion ended (the protocol's FinishReason, minus UNSPECIFIED)."""

    LENGTH = "length"  # max_new_tokens generated, or the context is full
    STOP = "stop"  # the text reached a stop string
    EOS = "eos"  # the model generated its end-of-sequence token
    CANCELLED = "cancelled"  # the server ended it (drain timeout) or the client went away
    DEADLINE = "deadline"  # the caller's deadline passed before it finished


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token; the defaults are greedy decoding."""

    temperature: float = 0.0  # 0: argmax (greedy); top_k, top_p and seed are then unused
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no nucleus filter
    repetition_penalty: float = 1.0  # 1: off; > 1 discourages tokens already seen
    seed: int | None = None  # None: a fresh random seed
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, bias) added to the logits; ids distinct
    min_p: float = 0.0  # 0: off; sampling keeps the ids at least min_p times as likely as the likeliest
    presence_penalty: float = 0.0  # 0: off; subtracted from the logit of each id the completion holds
    frequency_penalty: float = 0.0  # 0: off; times each id's count in the completion, subtracted

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


EARLY_STOPPING = ("false", "true", "never")  # transformers' early_stopping: False, True, "never"


@dataclass(frozen=True)
class BeamParams:
    """Beam search as transformers' generate defines it: `num_beams` beams, hypotheses scored by their
    log-probability over length ** `length_penalty`, `num_return_sequences` of them returned."""

    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: str = "false"  # one of EARLY_STOPPING
    num_return_sequences: int = 1


@dataclass(frozen=True)
class StreamInterval:
    """How often a stream sends: the first delta at once, then once `tokens` wait or `ms` have passed."""

    tokens: int = 1  # 1: every decode step's tokens go out as they come
    ms: int = 0  # 0: no time bound


@dataclass(frozen=True)
class Grammar:
    """A structured-output constraint, compiled and checked by the front end (engine/grammar.py)."""

    kind: str  # what the request gave: "json_schema" or "regex"
    text: str  # llguidance's grammar for it, which the engine's matcher runs


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request, ready for the engine."""

    request_id: str
    prompt_ids: tuple[int, ...]  # the encoded prompt (BOS first where the tokenizer adds it)
    max_new_tokens: int  # already clamped to the cap and the context
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    deadline: float | None = None  # time.monotonic() after which the request is dropped
    # When the engine hands the request's deltas on: a stream's interval (the default: every step), or
    # None for a call that only wants the whole completion (its deltas go out with the Final).
    interval: StreamInterval | None = StreamInterval()
    stop_token_ids: frozenset[int] = frozenset()  # generating one ends the request (STOP), as EOS does
    min_new_tokens: int = 0  # until then EOS and stop_token_ids are masked and stop strings not looked for
    ignore_eos: bool = False  # EOS is masked for the whole generation
    priority: int = 0  # admission order among queued requests: higher first, then arrival
    logprobs: int | None = None  # each generated token's log-probability and this many top alternatives
    prompt_logprobs: int | None = None  # each prompt token's (after the first), and this many alternatives
    n: int = 1  # completions of the prompt, prefilled once; completion i samples with seed + i
    grammar: Grammar | None = None  # structured output: every token the grammar does not allow is masked
    beams: BeamParams | None = None  # beam search (engine/beam_search.py); None: one completion per sample
    trace: str = ""  # the door span's W3C traceparent, for the engine core's spans ("": not traced)

    @property
    def slots(self) -> int:
        """Slots the request holds at once: one per beam, or one per completion."""
        return self.beams.num_beams if self.beams is not None else self.n

    @property
    def controls(self) -> tuple[str, ...]:
        """The request's controls that differ from their defaults, by field name (for metrics)."""
        given = {
            "stop_token_ids": bool(self.stop_token_ids),
            "min_new_tokens": self.min_new_tokens > 0,
            "ignore_eos": self.ignore_eos,
            "logit_bias": bool(self.sampling.logit_bias),
            "priority": self.priority != 0,
            "logprobs": self.logprobs is not None,
            "prompt_logprobs": self.prompt_logprobs is not None,
            "n": self.n > 1,
            "structured_output": self.grammar is not None,
            "beams": self.beams is not None,
        }
        return tuple(name for name, used in given.items() if used)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the runner's prefix cache


@dataclass(frozen=True)
class Timings:
    """Milliseconds from the request's arrival at the engine."""

    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the distribution it was picked from, and the most
    likely ids of that distribution with theirs (most likely first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int = 0  # a prompt token's rank in its distribution, 1 the likeliest (0: not counted)


@dataclass(frozen=True)
class Delta:
    """Tokens generated since the last event, and the text they completed (may be empty); with
    the request's `logprobs`, one TokenLogprob per token."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    index: int = 0  # the completion it belongs to (0 to n - 1)


@dataclass(frozen=True)
class Final:
    """The last event of a request: a last piece of text, and how and when it ended."""

    reason: FinishReason
    text: str
    usage: Usage
    timings: Timings
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # with the request's prompt_logprobs: tokens 1..n-1
    index: int = 0  # the completion that ended (0 to n - 1)
    remaining: int = 0  # the request's completions still running after this one: 0 ends the request
    score: float | None = None  # a beam search hypothesis's: its log-probability over length ** length_penalty
    # speculative decoding's (proposed, kept) ids over the request's completions that ended so far, where
    # one proposed (engine/speculation.py); the engine core's trace span reports them (not sent to clients)
    speculated: tuple[int, int] | None = None


def ends_request(event: Delta | Final | Exception) -> bool:
    """The last event of a request: an error, or the Final of its last completion."""
    return isinstance(event, Exception) or (isinstance(event, Final) and event.remaining == 0)


class ServeError(Exception):
    """Base of the errors a caller can cause; each subclass maps to one status code."""


class InvalidRequest(ServeError):
    """A request field is out of its limits: INVALID_ARGUMENT."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")
        self.field, self.problem = field_name, problem


class Undecodable(ServeError):
    """The request's bytes do not parse as the method's message: INVALID_ARGUMENT."""


class SlowReader(ServeError):
    """The client stopped reading its stream (the write timeout, or the buffer cap): CANCELLED."""


class UnknownModel(ServeError):
    """The Open Inference Protocol named a model (or version) this server does not serve: NOT_FOUND."""


class QueueFull(ServeError):
    """The wait queue holds --max-queue requests already: RESOURCE_EXHAUSTED."""


class Draining(ServeError):
    """The server is shutting down and takes no new requests: UNAVAILABLE."""


class EngineUnavailable(ServeError):
    """The engine core's process died: what was in flight ends, new calls are refused: UNAVAILABLE."""


class Unauthenticated(ServeError):
    """The call carries no bearer token or the wrong one: UNAUTHENTICATED."""


class DeadlineExceeded(ServeError):
    """The caller's deadline passed while the request waited or ran: DEADLINE_EXCEEDED."""
