"""RequestFields -> GenerationRequest, or InvalidRequest naming the field and its limit.

The only place request fields are checked, for every door: the engine trusts what comes out of
here. An error names the field as the caller sent it (RequestFields.origins). No gRPC, no HTTP.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ...engine.domain import (
    EARLY_STOPPING,
    BeamParams,
    GenerationRequest,
    Grammar,
    InvalidRequest,
    SamplingParams,
    StreamInterval,
)
from ...engine.grammar import GrammarError, compile_grammar
from ...request_ranges import MAX_LOGPROBS, MAX_N
from ...tokenizer import Tokenizer
from .request import RequestFields, check_ranges, renamed


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for; built once from the model and the command line."""

    context_length: int  # prompt tokens + max_new_tokens fit in it
    vocab_size: int  # top_k at most this
    max_new_tokens: int  # the cap (--max-new-tokens-cap, at most context_length - 1)
    max_stop_sequences: int = 16  # stop strings per request
    max_stop_bytes: int = 128  # UTF-8 bytes per stop string
    max_request_id_chars: int = 128  # printable ASCII
    encoder_decoder: bool = False  # the prompt is a source: it has the encoder's context to itself
    max_token_bytes: int = 1  # the most UTF-8 bytes one token stands for (the tokenizer's)
    bos_prepended: bool = True  # a text prompt's tokens start with BOS (the byte tokenizer)
    stream_interval: StreamInterval = StreamInterval()  # for requests that leave theirs unset
    max_stop_token_ids: int = 16  # stop_token_ids per request
    max_logit_bias: int = 300  # logit_bias entries per request (OpenAI's bound)
    max_logprobs: int = MAX_LOGPROBS  # top alternatives per token
    max_n: int = MAX_N  # completions per request, or the batch's slots if fewer
    max_structure_bytes: int = 32768  # a structured_output schema or pattern

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt (BOS included): a decoder-only prompt leaves room for one new token."""
        return self.context_length if self.encoder_decoder else self.context_length - 1

    @property
    def bos_note(self) -> str:
        return " (BOS included)" if self.bos_prepended else ""

    @property
    def max_prompt_bytes(self) -> int:
        """A text prompt longer than this cannot fit in max_prompt_tokens, however it is tokenized."""
        return self.max_prompt_tokens * max(1, self.max_token_bytes)


def check_request_id(request_id: str, limits: RequestLimits) -> str:
    if len(request_id) > limits.max_request_id_chars:
        raise InvalidRequest("request_id", f"{len(request_id)} characters, the limit is {limits.max_request_id_chars}")
    if request_id and not (request_id.isascii() and request_id.isprintable()):
        raise InvalidRequest("request_id", "must be printable ASCII")
    return request_id or uuid.uuid4().hex


def check_stop(stops, limits: RequestLimits) -> tuple[str, ...]:
    if len(stops) > limits.max_stop_sequences:
        raise InvalidRequest("stop", f"{len(stops)} strings, the limit is {limits.max_stop_sequences}")
    for i, stop in enumerate(stops):
        size = len(stop.encode("utf-8"))
        if not 1 <= size <= limits.max_stop_bytes:
            raise InvalidRequest(f"stop[{i}]", f"{size} UTF-8 bytes, must be 1 to {limits.max_stop_bytes}")
    return tuple(stops)


def check_sampling(request: RequestFields, limits: RequestLimits) -> SamplingParams:
    if not 0 <= request.top_k <= limits.vocab_size:
        raise InvalidRequest(
            "top_k",
            f"{request.top_k} is outside [0, {limits.vocab_size}] (0 keeps all, vocab_size {limits.vocab_size})",
        )

    def given(value: float | None, unset: float) -> float:
        return float(value) if value is not None else unset

    return SamplingParams(
        temperature=float(request.temperature),
        top_k=int(request.top_k),
        top_p=given(request.top_p, 1.0),
        repetition_penalty=given(request.repetition_penalty, 1.0),
        seed=request.seed,
        logit_bias=check_logit_bias(request, limits),
        min_p=given(request.min_p, 0.0),
        presence_penalty=given(request.presence_penalty, 0.0),
        frequency_penalty=given(request.frequency_penalty, 0.0),
    )


def check_token_id(name: str, token: int, limits: RequestLimits) -> int:
    if not 0 <= token < limits.vocab_size:
        raise InvalidRequest(name, f"{token} is outside [0, {limits.vocab_size}) (vocab_size {limits.vocab_size})")
    return int(token)


def check_logit_bias(request: RequestFields, limits: RequestLimits) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (id, bias) pairs: a bounded count, ids in the vocabulary (its biases' range is
    request_ranges.py's)."""
    bias = request.logit_bias
    if len(bias) > limits.max_logit_bias:
        raise InvalidRequest("logit_bias", f"{len(bias)} entries, the limit is {limits.max_logit_bias}")
    pairs = []
    for token in sorted(bias):
        check_token_id(f"logit_bias[{token}]", token, limits)
        pairs.append((int(token), float(bias[token])))
    return tuple(pairs)


def check_stop_token_ids(ids, limits: RequestLimits) -> frozenset[int]:
    if len(ids) > limits.max_stop_token_ids:
        raise InvalidRequest("stop_token_ids", f"{len(ids)} ids, the limit is {limits.max_stop_token_ids}")
    return frozenset(check_token_id(f"stop_token_ids[{i}]", token, limits) for i, token in enumerate(ids))


def check_min_new_tokens(request: RequestFields, max_new_tokens: int) -> int:
    wanted = request.min_new_tokens or 0
    if wanted > max_new_tokens:
        raise InvalidRequest("min_new_tokens", f"{wanted} is more than max_new_tokens {max_new_tokens}")
    return wanted


def check_lengths(request: RequestFields, prompt_tokens: int, limits: RequestLimits) -> int:
    """max_new_tokens after the cap and the context; a decoder-only prompt must leave it room."""
    if prompt_tokens > limits.max_prompt_tokens:
        why = (
            "the encoder's context_length" if limits.encoder_decoder else f"context_length {limits.context_length} - 1"
        )
        raise InvalidRequest(
            "prompt", f"{prompt_tokens} tokens{limits.bos_note}, the limit is {limits.max_prompt_tokens} ({why})"
        )
    decoder_prompt = 1 if limits.encoder_decoder else prompt_tokens  # an encoder-decoder decodes from BOS
    wanted = request.max_new_tokens
    if wanted is None:
        return min(limits.max_new_tokens, limits.context_length - decoder_prompt)
    if wanted == 0 and request.prompt_logprobs is not None:
        return 0  # the prompt is scored, nothing generated
    if not 1 <= wanted <= limits.max_new_tokens:
        raise InvalidRequest(
            "max_new_tokens",
            f"{wanted} is outside [1, {limits.max_new_tokens}] "
            "(the server's cap: --max-new-tokens-cap, at most context_length - 1; 0 only with prompt_logprobs)",
        )
    if not limits.encoder_decoder and prompt_tokens + wanted > limits.context_length:
        raise InvalidRequest(
            "prompt",
            f"{prompt_tokens} tokens{limits.bos_note}, the limit is "
            f"{limits.context_length - wanted} (context_length {limits.context_length} "
            f"- max_new_tokens {wanted})",
        )
    return wanted


def check_prompt_ids(ids, limits: RequestLimits) -> list[int]:
    """prompt_token_ids as given: each id in the vocabulary."""
    return [check_token_id(f"prompt_token_ids[{i}]", token, limits) for i, token in enumerate(ids)]


def check_stream_interval(request: RequestFields, limits: RequestLimits) -> StreamInterval:
    """A stream's interval: each field the request sets replaces the server's default."""
    tokens, ms = limits.stream_interval.tokens, limits.stream_interval.ms
    if request.stream_interval_tokens is not None:
        tokens = request.stream_interval_tokens
        if not 1 <= tokens <= limits.max_new_tokens:
            raise InvalidRequest(
                request.named("stream_interval_tokens"),
                f"{tokens} is outside [1, {limits.max_new_tokens}] (the max_new_tokens cap)",
            )
    if request.stream_interval_ms is not None:  # its range was validate's
        ms = request.stream_interval_ms
    return StreamInterval(tokens, ms)


def prompt_ids(request: RequestFields, limits: RequestLimits, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids: prompt encoded by the model's tokenizer, or prompt_token_ids."""
    if request.prompt and request.prompt_token_ids:
        raise InvalidRequest("prompt_token_ids", "give prompt or prompt_token_ids, not both")
    if request.prompt_token_ids:
        return check_prompt_ids(request.prompt_token_ids, limits)
    if not request.prompt:
        raise InvalidRequest("prompt", "must not be empty (or give prompt_token_ids)")
    size = len(request.prompt.encode("utf-8"))
    if size > limits.max_prompt_bytes:  # refused before the tokenizer spends time on it
        raise InvalidRequest(
            "prompt",
            f"{size} UTF-8 bytes, more than any {limits.max_prompt_tokens} tokens "
            f"can hold (the limit is {limits.max_prompt_tokens} tokens)",
        )
    return tokenizer.encode_prompt(request.prompt)


def validate(
    request: RequestFields, limits: RequestLimits, tokenizer: Tokenizer, deadline: float | None = None
) -> GenerationRequest:
    """The request as a GenerationRequest; raises InvalidRequest on the first bad field, named as the caller sent it."""
    try:
        return checked(request, limits, tokenizer, deadline)
    except InvalidRequest as error:
        raise renamed(error, request.origins) from None


def checked(request: RequestFields, limits: RequestLimits, tokenizer: Tokenizer, deadline: float | None):
    check_ranges(request)
    ids = prompt_ids(request, limits, tokenizer)
    request_id = check_request_id(request.request_id, limits)
    sampling = check_sampling(request, limits)
    stop = check_stop(request.stop, limits)
    max_new_tokens = check_lengths(request, len(ids), limits)
    return GenerationRequest(
        request_id,
        tuple(ids),
        max_new_tokens,
        sampling,
        stop,
        deadline,
        stop_token_ids=check_stop_token_ids(request.stop_token_ids, limits),
        min_new_tokens=check_min_new_tokens(request, max_new_tokens),
        ignore_eos=request.ignore_eos,
        priority=request.priority,
        logprobs=check_logprobs(request, "logprobs", limits),
        prompt_logprobs=check_logprobs(request, "prompt_logprobs", limits),
        n=check_n(request, limits),
        grammar=check_structure(request, limits, tokenizer),
        beams=check_beams(request, limits),
    )


# What beam search decodes without: each field's name and whether the request set it
NOT_WITH_BEAMS = {
    "temperature": lambda r: r.temperature > 0,
    "top_k": lambda r: r.top_k > 0,
    "top_p": lambda r: r.top_p is not None and r.top_p < 1,
    "min_p": lambda r: r.min_p not in (None, 0.0),
    "seed": lambda r: r.seed is not None,
    "repetition_penalty": lambda r: r.repetition_penalty not in (None, 1.0),
    "presence_penalty": lambda r: r.presence_penalty not in (None, 0.0),
    "frequency_penalty": lambda r: r.frequency_penalty not in (None, 0.0),
    "logit_bias": lambda r: bool(r.logit_bias),
    "logprobs": lambda r: r.logprobs is not None,
    "prompt_logprobs": lambda r: r.prompt_logprobs is not None,
    "n": lambda r: r.n not in (None, 1),
    "stop": lambda r: bool(r.stop),
    "structured_output": lambda r: r.structured_output is not None,
}


def check_beams(request: RequestFields, limits: RequestLimits) -> BeamParams | None:
    """Beam search's parameters (None without num_beams above 1); what beam search cannot take beside
    it is refused naming that field."""
    beams = request.num_beams if request.num_beams is not None else 1
    returned = request.num_return_sequences if request.num_return_sequences is not None else 1
    if not 1 <= beams <= limits.max_n:
        raise InvalidRequest(
            "num_beams", f"{beams} is outside [1, {limits.max_n}] (16, or the server's --max-batch if fewer)"
        )
    if not 1 <= returned <= beams:
        raise InvalidRequest("num_return_sequences", f"{returned} is outside [1, {beams}] (num_beams)")
    early = request.early_stopping if request.early_stopping is not None else "false"
    if early not in EARLY_STOPPING:
        raise InvalidRequest("early_stopping", f"{early!r} is not one of {', '.join(EARLY_STOPPING)}")
    if beams == 1:
        return None
    for name, given in NOT_WITH_BEAMS.items():
        if given(request):
            raise InvalidRequest(name, f"beam search (num_beams {beams}) decodes without it")
    penalty = request.length_penalty if request.length_penalty is not None else 1.0
    return BeamParams(int(beams), float(penalty), early, int(returned))


def check_structure(request: RequestFields, limits: RequestLimits, tokenizer: Tokenizer) -> Grammar | None:
    """structured_output's schema or pattern, bounded and compiled against the model's tokenizer."""
    if request.structured_output is None:
        return None
    kind, source = request.structured_output.kind, request.structured_output.source
    name = f"structured_output.{kind}"
    if kind is None:
        raise InvalidRequest("structured_output", "set json_schema or regex")
    size = len(source.encode("utf-8"))
    if not 1 <= size <= limits.max_structure_bytes:
        raise InvalidRequest(name, f"{size} UTF-8 bytes, must be 1 to {limits.max_structure_bytes}")
    try:
        return compile_grammar(kind, source, tokenizer)
    except GrammarError as e:
        raise InvalidRequest(name, str(e)) from None


def check_n(request: RequestFields, limits: RequestLimits) -> int:
    n = request.n if request.n is not None else 1
    if not 1 <= n <= limits.max_n:
        raise InvalidRequest("n", f"{n} is outside [1, {limits.max_n}] (16, or the server's --max-batch if fewer)")
    return int(n)


def check_logprobs(request: RequestFields, name: str, limits: RequestLimits) -> int | None:
    """logprobs or prompt_logprobs: None unset, else 0 to max_logprobs (prompt's: decoder-only)."""
    value = getattr(request, name)
    if value is None:
        return None
    if value > limits.max_logprobs:
        raise InvalidRequest(name, f"{value} is outside [0, {limits.max_logprobs}]")
    if name == "prompt_logprobs" and limits.encoder_decoder:
        raise InvalidRequest(name, "an encoder-decoder's prompt is its source, which its decoder does not predict")
    return int(value)
