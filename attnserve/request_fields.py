"""A request's fields, once: each with its attnserve.v1 name, the names the other doors take it
under, its range, what leaving it out means and one line of help.

The lists that used to be kept by hand come from here: the attnserve.v1 fields whose absence is
not their zero (proto3 `optional`), which the server reads as None and the clients leave unset
(server/grpc_v1/request.py, clients/types.py); the ranges both sides of the wire check before a
request is sent or served (RANGES, `problems`); and the reference page docs/reference/request-fields.md
(scripts/reference_pages/request_fields_page.py). tests/test_request_fields.py fails when the
.proto, the session's RequestFields, the clients' GenerationParams, the doors' name tables and this
table disagree. Adding a sampling field: its row here, the .proto, RequestFields, GenerationParams
(and ParamFields), and what the engine does with it. Standard library only: client hosts import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .request_ranges import (
    INT32_MAX,
    INT32_MIN,
    MAX_BIAS,
    MAX_LENGTH_PENALTY,
    MAX_LOGPROBS,
    MAX_N,
    MAX_STREAM_INTERVAL_MS,
    UINT32_MAX,
    Range,
)

TOKEN_ID = Range(0, INT32_MAX, narrowed="the model's vocab_size")


@dataclass(frozen=True)
class RequestField:
    name: str  # attnserve.v1's GenerateRequest field, and the session's RequestFields'
    help: str  # what it does, one line (Markdown)
    limits: str  # what a value may be (Markdown)
    unset: str  # what leaving it out means
    range: Range | None = None  # its number's (a list's: each element's) range, checked on both sides of the wire
    optional: bool = False  # attnserve.v1 tells "unset" from its zero (proto3 `optional`): None in the session
    oip: tuple[str, ...] = ()  # its names in the Open Inference Protocol's sampling_parameters (vLLM's)
    openai: tuple[str, ...] = ()  # its names in the OpenAI-compatible JSON body
    client: tuple[str, ...] | None = None  # GenerationParams' fields for it, where not its own name

    @property
    def client_fields(self) -> tuple[str, ...]:
        return (self.name,) if self.client is None else self.client


FIELDS: tuple[RequestField, ...] = (
    RequestField(
        "prompt",
        "the text to continue, or an encoder-decoder's source; the model's tokenizer encodes it",
        "non-empty UTF-8; its tokens (with BOS for `bytes`) at most `limits.max_prompt_tokens`",
        "one of `prompt` and `prompt_token_ids` is required",
        oip=("text_input",),
        openai=("prompt", "messages"),
        client=(),
    ),
    RequestField(
        "prompt_token_ids",
        "the prompt as token ids, used exactly as given (nothing prepended)",
        "ids in [0, `tokenizer.vocab_size`); as many as a prompt may have",
        "the prompt is `prompt`",
        range=TOKEN_ID,
        openai=("prompt",),
        client=(),
    ),
    RequestField(
        "request_id",
        "the request's id in logs, traces and the answer",
        "at most 128 printable ASCII characters",
        "the server assigns one",
        oip=("id",),
        client=(),
    ),
    RequestField(
        "max_new_tokens",
        "the most tokens to generate",
        "1 to `limits.max_new_tokens` (0 with `prompt_logprobs`: the prompt is only scored); "
        "decoder-only: prompt + it at most the context length",
        "as many as fit (the OpenAI door: 16, as OpenAI's)",
        range=Range(0, INT32_MAX, narrowed="the server's cap"),
        optional=True,
        oip=("max_tokens",),
        openai=("max_tokens", "max_completion_tokens"),
    ),
    RequestField(
        "temperature",
        "0 is greedy decoding; above 0 samples from the softened distribution",
        "0 to 100",
        "0 (the OpenAI door: 1, as OpenAI's)",
        range=Range(0.0, 100.0),
        oip=("temperature",),
        openai=("temperature",),
    ),
    RequestField(
        "top_k",
        "sample from the k most likely tokens",
        "0 to the vocabulary's size; 0 keeps all (vLLM's -1 too)",
        "0: all",
        range=Range(0, INT32_MAX, narrowed="the model's vocab_size"),
        oip=("top_k",),
        openai=("top_k",),
    ),
    RequestField(
        "top_p",
        "nucleus sampling: the fewest most likely tokens whose probabilities sum to p",
        "(0, 1]",
        "1: off",
        range=Range(0.0, 1.0, low_open=True),
        optional=True,
        oip=("top_p",),
        openai=("top_p",),
    ),
    RequestField(
        "min_p",
        "sampling: keep only the tokens at least this times as likely as the most likely one",
        "0 to 1",
        "0: off",
        range=Range(0.0, 1.0),
        optional=True,
        oip=("min_p",),
        openai=("min_p",),
    ),
    RequestField(
        "repetition_penalty",
        "above 1 discourages tokens already in the prompt or the output (CTRL's penalty)",
        "(0, 100]",
        "1: off",
        range=Range(0.0, 100.0, low_open=True),
        optional=True,
        oip=("repetition_penalty",),
        openai=("repetition_penalty",),
    ),
    RequestField(
        "presence_penalty",
        "subtracted from the logit of every token the completion has generated (OpenAI's)",
        "-2 to 2",
        "0: off",
        range=Range(-2.0, 2.0),
        optional=True,
        oip=("presence_penalty",),
        openai=("presence_penalty",),
    ),
    RequestField(
        "frequency_penalty",
        "times a token's count in the completion, subtracted from its logit (OpenAI's)",
        "-2 to 2",
        "0: off",
        range=Range(-2.0, 2.0),
        optional=True,
        oip=("frequency_penalty",),
        openai=("frequency_penalty",),
    ),
    RequestField(
        "seed",
        "the seed of this request's sampler: the same seed, the same tokens",
        "any uint64",
        "a fresh seed",
        range=Range(0, 2**64 - 1),
        optional=True,
        oip=("seed",),
        openai=("seed",),
    ),
    RequestField(
        "stop",
        "stop once the text contains one of these strings (not returned)",
        "at most 16 strings of 1 to 128 UTF-8 bytes",
        "none",
        oip=("stop",),
        openai=("stop",),
    ),
    RequestField(
        "stop_token_ids",
        "generating one of these ids ends the completion (`stop`, the id not returned)",
        "at most `limits.max_stop_token_ids` (16) ids in [0, vocab size)",
        "none",
        range=TOKEN_ID,
        oip=("stop_token_ids",),
        openai=("stop_token_ids",),
    ),
    RequestField(
        "min_new_tokens",
        "generate at least this many tokens: EOS and `stop_token_ids` masked, stop strings not looked for, until then",
        "0 to `max_new_tokens`",
        "0",
        range=Range(0, UINT32_MAX),
        optional=True,
        oip=("min_tokens",),
        openai=("min_tokens",),
    ),
    RequestField(
        "ignore_eos",
        "EOS is masked: the completion ends only at its length, the context, a stop string or id",
        "true or false",
        "false",
        oip=("ignore_eos",),
        openai=("ignore_eos",),
    ),
    RequestField(
        "logit_bias",
        "id -> bias added to that token's logit before sampling",
        "at most `limits.max_logit_bias` (300) ids in [0, vocab size), each bias in [-100, 100]",
        "none",
        range=Range(-MAX_BIAS, MAX_BIAS),
        oip=("logit_bias",),
        openai=("logit_bias",),
    ),
    RequestField(
        "priority",
        "queued requests are admitted higher first, then in arrival order (no preemption)",
        "any int32",
        "0",
        range=Range(INT32_MIN, INT32_MAX),
        oip=("priority",),
        openai=("priority",),
    ),
    RequestField(
        "logprobs",
        "each generated token's log-probability and this many most likely alternatives",
        "0 to `limits.max_logprobs` (20)",
        "none",
        range=Range(0, MAX_LOGPROBS),
        optional=True,
        openai=("logprobs", "top_logprobs"),
    ),
    RequestField(
        "prompt_logprobs",
        "each prompt token's log-probability given those before it, and this many alternatives",
        "0 to `limits.max_logprobs` (20); decoder-only",
        "none",
        range=Range(0, MAX_LOGPROBS),
        optional=True,
        openai=("prompt_logprobs",),
    ),
    RequestField(
        "n",
        "completions of the prompt, prefilled once; completion i samples with `seed` + i",
        "1 to `limits.max_n` (16, or the server's `--max-batch` if fewer)",
        "1",
        range=Range(1, MAX_N, narrowed="the server's --max-batch"),
        optional=True,
        openai=("n",),
    ),
    RequestField(
        "structured_output",
        "the output is one JSON value the schema validates, or matches the regular expression; ends `stop` once whole",
        "`json_schema` (a JSON Schema's text) or `regex` (Rust syntax), at most `limits.max_structure_bytes` "
        "(32768) UTF-8 bytes",
        "none",
        optional=True,
        client=("json_schema", "regex"),
        oip=("guided_json", "guided_regex"),
        openai=("guided_json", "guided_regex", "response_format"),
    ),
    RequestField(
        "num_beams",
        "beam search with this many beams, as transformers' `generate(num_beams=k)`; deterministic",
        "1 to `limits.max_n` (16, or the server's `--max-batch` if fewer); refused beside sampling fields, "
        "`logprobs`, `prompt_logprobs`, `n`, `stop` and `structured_output`",
        "1: no beam search",
        range=Range(1, MAX_N, narrowed="the server's --max-batch"),
        optional=True,
        oip=("use_beam_search", "best_of"),
        openai=("use_beam_search", "best_of"),
    ),
    RequestField(
        "length_penalty",
        "beam search: a hypothesis's score is its log-probability over (its length ** this)",
        f"{-MAX_LENGTH_PENALTY:g} to {MAX_LENGTH_PENALTY:g}; above 0 favours longer hypotheses",
        "1",
        range=Range(-MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY),
        optional=True,
        oip=("length_penalty",),
        openai=("length_penalty",),
    ),
    RequestField(
        "early_stopping",
        "beam search: when it stops, transformers' rules",
        '`"false"`, `"true"` or `"never"` (the other doors: true, false or "never")',
        '`"false"`',
        oip=("early_stopping",),
        openai=("early_stopping",),
    ),
    RequestField(
        "num_return_sequences",
        "beam search: how many of the best hypotheses come back, best first, each with its score",
        "1 to `num_beams`",
        "1",
        range=Range(1, MAX_N, narrowed="num_beams"),
        optional=True,
        openai=("n",),  # with use_beam_search
    ),
    RequestField(
        "stream_interval_tokens",
        "a stream sends a message once this many tokens wait (the first at once, the end never held)",
        "1 to `limits.max_new_tokens`",
        "the server's `--stream-interval-tokens`",
        range=Range(1, UINT32_MAX, narrowed="the server's max_new_tokens cap"),
        optional=True,
        oip=("stream_interval_tokens",),
        openai=("stream_interval_tokens",),
    ),
    RequestField(
        "stream_interval_ms",
        "... or once this many milliseconds have passed, whichever first; 0 is no time bound",
        f"0 to {MAX_STREAM_INTERVAL_MS}",
        "the server's `--stream-interval-ms`",
        range=Range(0, MAX_STREAM_INTERVAL_MS),
        optional=True,
        oip=("stream_interval_ms",),
        openai=("stream_interval_ms",),
    ),
)
BY_NAME = {f.name: f for f in FIELDS}
# attnserve.v1's scalar fields that tell "unset" from zero (structured_output is a message of its own)
OPTIONAL = tuple(f.name for f in FIELDS if f.optional and f.name != "structured_output")
RANGES: dict[str, Range] = {f.name: f.range for f in FIELDS if f.range is not None}


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
