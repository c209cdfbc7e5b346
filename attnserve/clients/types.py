"""Plain results the clients return, and their conversions to and from the protocol's messages.

Callers never see protobuf: a request is built from a prompt (text, or token ids) and one
`GenerationParams`, a response becomes a frozen dataclass with a lowercase finish reason.
Knows nothing about channels or retries.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypedDict

from attnserve.v1 import generation_pb2 as pb

from ..flags import flag
from ..request_fields import OPTIONAL

if TYPE_CHECKING:
    from typing_extensions import Unpack

_REASON_PREFIX = "FINISH_REASON_"

# What generate and stream take: text for the server's tokenizer to encode, or token ids that
# it uses exactly as given (nothing prepended), as OpenAI's and vLLM's completions accept.
Prompt = str | Sequence[int]


class ParamFields(TypedDict, total=False):
    """The fields of `GenerationParams`, for the keyword arguments that override them."""

    max_new_tokens: int | None
    temperature: float
    top_k: int
    top_p: float | None
    min_p: float | None
    repetition_penalty: float | None
    presence_penalty: float | None
    frequency_penalty: float | None
    seed: int | None
    stop: Sequence[str]
    stream_interval_tokens: int | None
    stream_interval_ms: int | None
    stop_token_ids: Sequence[int]
    min_new_tokens: int | None
    ignore_eos: bool
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]]
    priority: int
    logprobs: int | None
    prompt_logprobs: int | None
    n: int | None
    json_schema: Mapping[str, Any] | str | None
    regex: str | None
    num_beams: int | None
    length_penalty: float | None
    early_stopping: str | None
    num_return_sequences: int | None


@dataclass(frozen=True)
class GenerationParams:
    """How to decode a request: built once (by the caller, `generate` or bench) and sent whole.

    Fields with help are `attnserve generate` flags (the stream interval's are `bench`'s too).
    """

    max_new_tokens: int | None = field(
        default=None, metadata=flag("most tokens to generate", unset="the server's cap", metavar="N")
    )
    temperature: float = field(default=0.0, metadata=flag("0 is greedy decoding; above 0 samples"))
    top_k: int = field(default=0, metadata=flag("sample from the k most likely tokens; 0: all of them", metavar="K"))
    top_p: float | None = field(default=None, metadata=flag("nucleus sampling threshold in (0, 1]", unset="off"))
    min_p: float | None = field(
        default=None,
        metadata=flag("sample only ids at least P times as likely as the likeliest (0-1)", unset="off", metavar="P"),
    )
    repetition_penalty: float | None = field(
        default=None, metadata=flag("> 1 discourages repeats (1: off)", unset="off")
    )
    presence_penalty: float | None = field(
        default=None,
        metadata=flag("subtracted from each generated id's logit (-2 to 2, OpenAI's)", unset="off", metavar="P"),
    )
    frequency_penalty: float | None = field(
        default=None,
        metadata=flag("times each id's count in the output, subtracted (-2 to 2, OpenAI's)", unset="off", metavar="F"),
    )
    seed: int | None = field(
        default=None, metadata=flag("seed of this request's sampler", unset="the server draws one")
    )
    stop: Sequence[str] = ()  # stop once the text contains one of these ("\n" alone is one); --stop, repeated
    # Streams only: the first delta and the end are never held. None: the server's.
    stream_interval_tokens: int | None = field(
        default=None,
        metadata=flag("stream a message once N tokens wait (the first at once)", unset="the server's", metavar="N"),
    )
    stream_interval_ms: int | None = field(
        default=None,
        metadata=flag(
            "... or once MS milliseconds have passed, whichever first (0: no time bound)",
            unset="the server's",
            metavar="MS",
        ),
    )

    # Generating one of these ids ends the completion (STOP; the id is not returned); --stop-token-ids ID,ID,...
    stop_token_ids: Sequence[int] = ()
    min_new_tokens: int | None = field(
        default=None,
        metadata=flag(
            "generate at least N tokens: EOS and stop ids masked, stop strings not looked for until then",
            unset="0",
            metavar="N",
        ),
    )
    ignore_eos: bool = field(default=False, metadata=flag("never generate EOS (for fixed-length runs)"))
    # id -> bias added to its logit, each in [-100, 100] (a mapping or (id, bias) pairs); --logit-bias ID=BIAS
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]] = ()
    priority: int = field(
        default=0, metadata=flag("admission order among queued requests: higher first, then arrival", metavar="N")
    )
    logprobs: int | None = field(
        default=None,
        metadata=flag(
            "each token's log-probability and the N most likely alternatives (0-20; generate --json prints them)",
            unset="none",
            metavar="N",
        ),
    )
    prompt_logprobs: int | None = field(
        default=None,
        metadata=flag(
            "each prompt token's log-probability given those before it, and N alternatives (0-20); "
            "with --max-new-tokens 0 the prompt is only scored",
            unset="none",
            metavar="N",
        ),
    )
    n: int | None = field(
        default=None,
        metadata=flag(
            "N completions of the prompt, prefilled once, completion i sampled with --seed + i (1-16; "
            "printed one after the other)",
            unset="1",
            metavar="N",
        ),
    )
    # Structured output, one of the two: the output is one JSON value this schema validates (a mapping,
    # or its JSON text; --json-schema TEXT or @FILE), or it matches the regular expression.
    json_schema: Mapping[str, Any] | str | None = None
    regex: str | None = field(
        default=None,
        metadata=flag("the whole output matches this regular expression (Rust syntax)", unset="none", metavar="RE"),
    )
    num_beams: int | None = field(
        default=None,
        metadata=flag(
            "beam search with N beams, as transformers' generate(num_beams=N) (1-16): deterministic, the best "
            "hypotheses come back once the search ends (printed one after the other with their scores)",
            unset="1: no beam search",
            metavar="N",
        ),
    )
    length_penalty: float | None = field(
        default=None,
        metadata=flag(
            "beam search: a hypothesis scores its log-probability over length ** X (-10 to 10; above 0 favours "
            "longer ones)",
            unset="1",
            metavar="X",
        ),
    )
    early_stopping: str | None = field(
        default=None,
        metadata=flag(
            "beam search: when it stops (transformers' early_stopping): false, true or never",
            unset="false",
            choices=("false", "true", "never"),
        ),
    )
    num_return_sequences: int | None = field(
        default=None,
        metadata=flag("beam search: the N best hypotheses come back (1 to --num-beams)", unset="1", metavar="N"),
    )

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)  # tuples, so that the params stay hashable
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((int(i), float(b)) for i, b in bias)))
        if self.json_schema is not None and self.regex is not None:
            raise ValueError("give json_schema or regex, not both")
        if isinstance(self.json_schema, Mapping):  # its JSON text, so that the params stay hashable
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))

    def replace(self, **overrides: Unpack[ParamFields]) -> GenerationParams:
        """A copy with some fields changed (keyword arguments of generate and stream)."""
        return dataclasses.replace(self, **overrides) if overrides else self

    def request(self, prompt: Prompt, request_id: str = "") -> pb.GenerateRequest:
        """The GenerateRequest; fields left at None stay unset, so the server's defaults apply."""
        request = pb.GenerateRequest(**prompt_fields(prompt), request_id=request_id)
        request.temperature, request.top_k = self.temperature, self.top_k
        request.ignore_eos, request.priority = self.ignore_eos, self.priority
        request.stop.extend(self.stop)
        request.stop_token_ids.extend(self.stop_token_ids)
        request.logit_bias.update(dict(self.logit_bias))
        if self.json_schema is not None:
            request.structured_output.json_schema = str(self.json_schema)
        if self.regex is not None:
            request.structured_output.regex = self.regex
        if self.early_stopping is not None:
            request.early_stopping = self.early_stopping
        for name in OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                setattr(request, name, value)
        return request


@dataclass(frozen=True)
class Usage:
    """Token counts of one request, as the server counted them."""

    prompt_tokens: int  # BOS included where the tokenizer prepends it
    completion_tokens: int  # tokens returned in token_ids (EOS excluded)
    cached_tokens: int = 0  # prompt tokens served from the server's prefix cache (not prefilled)


@dataclass(frozen=True)
class Timings:
    """Server-side milliseconds from the request's arrival at the server."""

    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float


@dataclass(frozen=True)
class GenerationResult:
    """A whole completion: what Generate returns, and what a finished stream adds up to."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "length", "stop", "eos" or "cancelled"
    usage: Usage | None  # None only for a stream this client cancelled
    timings: Timings | None  # likewise
    request_id: str
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token of token_ids, when the request asked
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # one per prompt token after the first, when asked
    # With n > 1: every completion in index order (the fields above are completion 0's; usage counts all)
    completions: tuple[CompletionResult, ...] = ()
    score: float = 0.0  # with num_beams > 1: the best hypothesis's (its log-probability over length ** penalty)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (token_ids as lists; logprobs, completions and scores only when asked for)."""
        out = asdict(self)
        out["token_ids"] = list(self.token_ids)
        for completion in out["completions"]:
            completion["token_ids"] = list(completion["token_ids"])
            if not completion["score"]:
                del completion["score"]
        for name in ("logprobs", "prompt_logprobs", "completions", "score"):  # score: a beam search's
            if not out[name]:
                del out[name]
        return out


@dataclass(frozen=True)
class CompletionResult:
    """One of the n completions of a request."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()
    score: float = 0.0  # a beam search hypothesis's


@dataclass(frozen=True)
class TopLogprob:
    """An id of a step's distribution, its log-probability and its text (decoded alone)."""

    token_id: int
    logprob: float
    text: str


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and text, and the step's most likely ids (most likely first)."""

    token_id: int
    logprob: float
    text: str
    top: tuple[TopLogprob, ...] = ()


def logprobs_from(messages: Any) -> tuple[TokenLogprob, ...]:
    """TokenLogprob messages as dataclasses."""
    return tuple(
        TokenLogprob(m.token_id, m.logprob, m.text, tuple(TopLogprob(t.token_id, t.logprob, t.text) for t in m.top))
        for m in messages
    )


@dataclass(frozen=True)
class StreamDelta:
    """Text and token ids generated since the previous delta (the text may be empty), and their
    logprobs when the request asked."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    index: int = 0  # the completion it belongs to (n > 1)


@dataclass(frozen=True)
class Limits:
    """What the server enforces on each request and on its queue."""

    max_new_tokens: int
    max_prompt_tokens: int
    max_batch_size: int
    max_queue_size: int
    max_stop_sequences: int
    max_stop_bytes: int
    stream_interval_tokens: int = 1  # the server's default stream interval (0 from an older server)
    stream_interval_ms: int = 0
    max_stop_token_ids: int = 0  # 0 from an older server, which has no such field
    max_logit_bias: int = 0
    max_logprobs: int = 0
    max_n: int = 0  # completions one request may ask for
    max_structure_bytes: int = 0  # a structured-output schema or grammar, in bytes


@dataclass(frozen=True)
class TokenizerInfo:
    """The model's tokenizer: which kind, its vocabulary and special ids."""

    kind: str  # "bytes" (ids 0-255 are UTF-8 bytes) or "bpe"
    bos_id: int
    eos_id: int
    pad_id: int
    vocab_size: int = 0  # prompt token ids are in [0, vocab_size); 0: an older server
    bos_prepended: bool = False  # BOS goes before a text prompt (bytes: yes, bpe: no)

    @property
    def special_ids(self) -> frozenset[int]:
        """BOS, EOS and PAD: ids a tokenizer never makes from text."""
        return frozenset((self.bos_id, self.eos_id, self.pad_id))


@dataclass(frozen=True)
class ModelInfo:
    """The served model, the execution provider it runs on, and the server's limits."""

    model_name: str
    architecture: str
    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int
    head_dim: int
    context_length: int
    dtype: str
    quantization: str
    execution_provider: str
    limits: Limits = field(repr=False)
    tokenizer: TokenizerInfo = field(repr=False)
    server_version: str = ""
    n_encoder_layers: int = 0  # encoder-decoder models; 0 for decoder-only
    kv_cache: str = ""  # "arena": keys/values written in place in preallocated slots
    kv_cache_bytes: int = 0  # the arena's size, fixed at the server's start-up
    prefix_cache_bytes: int = 0  # the prefix cache's pool, fixed at start-up; 0 when it is off

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict."""
        return asdict(self)


def _copy_fields(cls: type, message: Any, **nested: Any) -> Any:
    """A dataclass built from the same-named fields of a protobuf message."""
    values = {f.name: getattr(message, f.name) for f in fields(cls) if f.name not in nested}
    return cls(**values, **nested)


def model_info_from_proto(message: pb.ModelInfo) -> ModelInfo:
    """ModelInfo from its protobuf message."""
    return _copy_fields(
        ModelInfo,
        message,
        limits=_copy_fields(Limits, message.limits),
        tokenizer=_copy_fields(TokenizerInfo, message.tokenizer),
    )


def finish_reason_name(value: int) -> str:
    """FINISH_REASON_LENGTH -> "length"; UNSPECIFIED -> ""."""
    if value == pb.FINISH_REASON_UNSPECIFIED:
        return ""
    return pb.FinishReason.Name(value).removeprefix(_REASON_PREFIX).lower()


def prompt_fields(prompt: Prompt) -> dict[str, Any]:
    """{"prompt": text} or {"prompt_token_ids": ids}; TypeError or ValueError for neither.

    An empty text goes to the server, which names the limit; an empty list of ids cannot be
    sent (it would read as an empty text), so it is refused here, like ids that are not ints.
    """
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, (bytes, bytearray)):
        raise TypeError("prompt: bytes are ambiguous; give text (str) or token ids (list of int)")
    try:
        ids = list(prompt)
    except TypeError:
        raise TypeError(
            f"prompt: expected text (str) or token ids (a sequence of int), not {type(prompt).__name__}"
        ) from None
    for i, token_id in enumerate(ids):
        if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
            raise TypeError(f"prompt_token_ids[{i}]: {token_id!r} is not an int")
    if not ids:
        raise ValueError("prompt_token_ids: must not be empty")
    return {"prompt_token_ids": [int(token_id) for token_id in ids]}


def build_request(
    prompt: Prompt, params: GenerationParams | None = None, *, request_id: str = "", **overrides: Unpack[ParamFields]
) -> pb.GenerateRequest:
    """The GenerateRequest of `params` (default: greedy), with any field overridden by keyword."""
    return (params or GenerationParams()).replace(**overrides).request(prompt, request_id)


def completions_of(request: pb.GenerateRequest) -> int:
    """The completions a request's stream ends after: n, or a beam search's num_return_sequences."""
    if request.HasField("num_beams") and request.num_beams > 1:
        return request.num_return_sequences if request.HasField("num_return_sequences") else 1
    return request.n if request.HasField("n") else 1


def result_from_response(message: pb.GenerateResponse) -> GenerationResult:
    """GenerationResult from a unary Generate response."""
    return GenerationResult(
        text=message.text,
        token_ids=tuple(message.token_ids),
        finish_reason=finish_reason_name(message.finish_reason),
        usage=_copy_fields(Usage, message.usage),
        timings=_copy_fields(Timings, message.timings),
        request_id=message.request_id,
        logprobs=logprobs_from(message.logprobs),
        prompt_logprobs=logprobs_from(message.prompt_logprobs),
        completions=tuple(
            CompletionResult(
                c.index,
                c.text,
                tuple(c.token_ids),
                finish_reason_name(c.finish_reason),
                c.completion_tokens,
                logprobs_from(c.logprobs),
                c.score,
            )
            for c in message.completions
        ),
        score=message.score,
    )


@dataclass
class _Completion:
    """What a stream has brought of one completion so far."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    reason: str = ""  # set by its final message
    score: float = 0.0  # likewise (a beam search hypothesis's)
    usage: Usage | None = None
    timings: Timings | None = None


class StreamAccumulator:
    """Turns GenerateStream messages into deltas and, once every completion's final message came, the
    whole result."""

    def __init__(self, n: int = 1) -> None:
        """`n`: the request's completions; the result is set once each has its final message."""
        self.n = n
        self.parts: dict[int, _Completion] = {}  # by completion index
        self.prompt_logprobs: tuple[TokenLogprob, ...] = ()  # from the final message
        self.request_id = ""
        self.messages = 0  # messages received; gRPC retries no call once the first arrived
        self.result: GenerationResult | None = None

    def feed(self, message: pb.GenerateStreamResponse) -> StreamDelta | None:
        """Record one message; the delta to hand the caller, or None if it carried nothing."""
        self.messages += 1
        self.request_id = message.request_id or self.request_id
        part = self.parts.setdefault(message.index, _Completion())
        part.texts.append(message.text)
        part.token_ids.extend(message.token_ids)
        logprobs = logprobs_from(message.logprobs)
        part.logprobs.extend(logprobs)
        if message.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            part.reason = finish_reason_name(message.finish_reason)
            part.score = message.score
            part.usage = _copy_fields(Usage, message.usage)
            part.timings = _copy_fields(Timings, message.timings)
            self.prompt_logprobs = logprobs_from(message.prompt_logprobs) or self.prompt_logprobs
            if sum(1 for p in self.parts.values() if p.usage is not None) >= self.n:
                self.result = self._result()
        if not message.text and not message.token_ids:
            return None
        return StreamDelta(message.text, tuple(message.token_ids), logprobs, message.index)

    def cancelled(self) -> GenerationResult:
        """What arrived before this client cancelled the stream."""
        for part in self.parts.values():
            part.reason, part.usage, part.timings = part.reason or "cancelled", None, None
        self.result = self._result()
        return self.result

    def _result(self) -> GenerationResult:
        """Completion 0's text and tokens; usage and timings of the request (None once cancelled)."""
        first = self.parts.get(0, _Completion(reason="cancelled"))
        ended = [(p.usage, p.timings) for p in self.parts.values() if p.usage is not None and p.timings is not None]
        usage, timings = None, None
        if first.usage is not None and first.timings is not None:
            generated = sum(u.completion_tokens for u, _ in ended)
            usage = Usage(first.usage.prompt_tokens, generated, first.usage.cached_tokens)
            timings = replace(first.timings, total_ms=max(t.total_ms for _, t in ended))
        completions = tuple(
            CompletionResult(
                index,
                "".join(part.texts),
                tuple(part.token_ids),
                part.reason or "cancelled",
                len(part.token_ids),
                tuple(part.logprobs),
                part.score,
            )
            for index, part in sorted(self.parts.items())
        )
        return GenerationResult(
            "".join(first.texts),
            tuple(first.token_ids),
            first.reason or "cancelled",
            usage,
            timings,
            self.request_id,
            tuple(first.logprobs),
            self.prompt_logprobs,
            completions if len(completions) > 1 else (),
            first.score,
        )
