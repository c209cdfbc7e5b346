"""An OpenAI completions request (POST /v1/completions, its JSON body) and a chat completions request
(POST /v1/chat/completions) as the session's RequestFields, each field's origin the name the caller sent.

OpenAI's fields: `model`, `prompt` (a text or token ids, or a list of one of them), `max_tokens`
(default 16, as OpenAI's), `temperature` (default 1, as OpenAI's), `top_p`, `n`, `stop`, `seed`,
`logprobs`, `logit_bias`, `stream`, `stream_options.include_usage`, `echo`, `user` (ignored); vLLM's
extra sampling fields with the Open Inference Protocol's parsers (`top_k`, `repetition_penalty`,
`min_tokens`, `ignore_eos`, `stop_token_ids`, `priority`, `guided_json`, `guided_regex`,
`prompt_logprobs`, attnserve's stream interval; session/vllm_names.py). What the model cannot do is
refused, naming the field: several prompts, `suffix`, `best_of` other than n without vLLM's
`use_beam_search`, presence and frequency penalties, echo with logprobs. With `use_beam_search`
(vLLM's beam search: `best_of` beams, the `n` best hypotheses as the choices, `length_penalty`,
`early_stopping`), a request that leaves `temperature` out decodes at 0, as beam search must.

A chat takes `messages` for the prompt and has fields of its own (CHAT_OWN), each parsed by the
completions' parser of the field it stands for and named as chat's: `max_completion_tokens` (max_tokens),
`logprobs: true` with `top_logprobs` (logprobs), `response_format` (guided_json). Its messages are
bounded before the template renders them (MAX_CHAT_MESSAGES, and their contents' bytes by the prompt's
byte bound), and the rendered prompt is bounded before it is tokenized. The result goes through the
session's `validate` like any other request. No HTTP, no engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...engine.domain import InvalidRequest
from ...tokenizer.chat_template import ChatTemplate, ChatTemplateError
from ..session.request import RequestFields
from ..session.validation import RequestLimits
from ..session.vllm_names import SAMPLING_FIELDS, as_bool, as_int, parse_field, request_of

DEFAULT_MAX_TOKENS = 16  # OpenAI's, when a request leaves max_tokens out
DEFAULT_TEMPERATURE = 1.0  # OpenAI's
MAX_CHAT_MESSAGES = 4096  # messages in one chat request: the template's work is bounded before it starts
FIELDS = {
    **SAMPLING_FIELDS,
    "n": ("n", as_int, "an integer"),
    "logprobs": ("logprobs", as_int, "an integer"),
    "prompt_logprobs": ("prompt_logprobs", as_int, "an integer"),
}
OWN = frozenset({"model", "prompt", "stream", "stream_options", "echo", "user", "suffix"})


@dataclass(frozen=True)
class CompletionCall:
    """What one completions (or chat) request asks for."""

    request: RequestFields
    model: str
    stream: bool
    include_usage: bool  # a last streamed chunk with the usage (stream_options.include_usage)
    echo: bool  # the text starts with the prompt


def read_completion(body: Any) -> CompletionCall:
    """The request as the session's RequestFields and how to answer it; InvalidRequest names the JSON field."""
    model = model_of(body)
    refuse_the_unsupported(body)
    stream = flag(body, "stream")
    echo = flag(body, "echo")
    include_usage = stream_options(body, stream)
    prompt, origins = prompt_of(body.get("prompt"))
    fields = sampling(body, origins)
    if echo and "logprobs" in fields:
        raise InvalidRequest("echo", "echo with logprobs is not supported (ask for prompt_logprobs)")
    return CompletionCall(request_of(fields, origins, **prompt), model, stream, include_usage, echo)


def model_of(body: Any) -> str:
    """The model the body names (the door checks it first); InvalidRequest without one."""
    if not isinstance(body, dict):
        raise InvalidRequest("body", f"a JSON object is expected, not {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model", "required: the served model's name (GET /v1/models lists it)")
    return model


def refuse_the_unsupported(body: dict[str, Any]) -> None:
    """InvalidRequest for an unknown field or a suffix."""
    unknown = [key for key in body if key not in FIELDS and key not in OWN]
    if unknown:
        raise InvalidRequest(unknown[0], f"unknown field (known: {', '.join(sorted({*FIELDS, *OWN}))})")
    if body.get("suffix") not in (None, ""):
        raise InvalidRequest("suffix", "is not supported by this model")


def sampling(
    body: dict[str, Any], origins: dict[str, str], own: Mapping[str, tuple[Any, str]] | None = None
) -> dict[str, Any]:
    """RequestFields' fields from the sampling fields, OpenAI's defaults where left out (a JSON null:
    the field's own default; max_tokens then as many as fit); `origins` learns where each came from.
    `own`: a door's own fields, as the FIELDS key whose parser reads each -> (its value, its name as sent)."""
    fields: dict[str, Any] = {"max_new_tokens": DEFAULT_MAX_TOKENS, "temperature": DEFAULT_TEMPERATURE}
    origins.update(max_new_tokens="max_tokens", temperature="temperature")
    sent = {key: (value, key) for key, value in body.items()}
    sent.update(own or {})  # a door's own field in the place of the one whose parser reads it
    for key, (value, where) in sent.items():
        if key not in FIELDS:
            continue
        if value is None:
            fields.pop(FIELDS[key][0], None)
            continue
        name, parsed = parse_field(FIELDS, key, value, where)
        fields[name], origins[name] = parsed, where
    if fields.get("use_beam_search") and body.get("temperature") is None:
        fields["temperature"] = 0.0  # OpenAI's default of 1 is sampling; beam search takes none
    return fields


def flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    try:
        return as_bool(value)
    except ValueError:
        raise InvalidRequest(key, f"{value!r} is not true or false") from None


def stream_options(body: dict[str, Any], stream: bool) -> bool:
    """stream_options.include_usage (only with stream, as OpenAI says)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise InvalidRequest("stream_options", "only allowed with stream: true")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise InvalidRequest("stream_options", f"{options!r} is not an object of include_usage")
    return flag(options, "include_usage")


def prompt_of(prompt: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The prompt as RequestFields' prompt or prompt_token_ids; origins naming `prompt` for both."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a list of one prompt
    origins = {"prompt": "prompt", "prompt_token_ids": "prompt"}
    if isinstance(prompt, str):
        return {"prompt": prompt}, origins
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        return {"prompt_token_ids": tuple(prompt)}, origins
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise InvalidRequest("prompt", f"{len(prompt)} prompts: this server takes one prompt per request")
    raise InvalidRequest("prompt", "required: a text, a list of token ids, or a list of one of them")


CHAT_OWN = frozenset({"messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format"})


def read_chat(
    body: Any, template: ChatTemplate, limits: RequestLimits, encode: Callable[[str], list[int]]
) -> CompletionCall:
    """The chat request as the session's RequestFields, its errors naming chat's fields: the messages bounded,
    rendered by the model's chat template and the prompt bounded before `encode` (the tokenizer's encode_chat)
    spends time on it; then the rest read as a completion's, chat's own fields by the parsers they share."""
    model = model_of(body)
    if "prompt" in body or "echo" in body:
        raise InvalidRequest("prompt" if "prompt" in body else "echo", "unknown field for chat (send messages)")
    prompt = rendered(template, chat_messages(body.get("messages"), limits), limits)
    own = chat_own(body)
    ids = encode(prompt)
    rest = {key: value for key, value in body.items() if key not in CHAT_OWN}
    refuse_the_unsupported(rest)
    stream = flag(rest, "stream")
    include_usage = stream_options(rest, stream)
    if not ids:
        raise InvalidRequest("messages", "required: a text, a list of token ids, or a list of one of them")
    origins = {"prompt": "messages", "prompt_token_ids": "messages"}
    fields = sampling(rest, origins, own)
    return CompletionCall(request_of(fields, origins, prompt_token_ids=tuple(ids)), model, stream, include_usage, False)


def chat_own(body: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """Chat's own fields as the completions' fields whose parsers read them -> (the value, chat's name):
    max_completion_tokens as max_tokens, logprobs: true with top_logprobs as logprobs, response_format's
    schema as guided_json."""
    own: dict[str, tuple[Any, str]] = {}
    if body.get("max_completion_tokens") is not None:
        own["max_tokens"] = (body["max_completion_tokens"], "max_completion_tokens")
    if flag(body, "logprobs"):
        own["logprobs"] = (body.get("top_logprobs") or 0, "top_logprobs")
    elif body.get("top_logprobs") is not None:
        raise InvalidRequest("top_logprobs", "needs logprobs: true")
    schema = response_schema(body.get("response_format"))
    if schema is not None:
        own["guided_json"] = (schema, "response_format")
    return own


def chat_messages(messages: Any, limits: RequestLimits) -> list[dict[str, str]]:
    """`messages` as [{"role", "content"}] with text content (a list of text parts is joined): at most
    MAX_CHAT_MESSAGES, their contents together no longer than a prompt may be."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages", "required: a non-empty list of {role, content}")
    if len(messages) > MAX_CHAT_MESSAGES:
        raise InvalidRequest("messages", f"{len(messages)} messages, the limit is {MAX_CHAT_MESSAGES}")
    out, size = [], 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"messages[{i}]", "an object with a role and a content is expected")
        content = message.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content", "text (or a list of text parts) is expected")
        size += utf8_bytes(content)
        if size > limits.max_prompt_bytes:
            raise InvalidRequest(f"messages[{i}].content", too_long(f"the contents so far are {size}", limits))
        out.append({"role": message["role"], "content": content})
    return out


def rendered(template: ChatTemplate, messages: list[dict[str, str]], limits: RequestLimits) -> str:
    """The prompt the template renders, refused before the tokenizer spends time on it if too long."""
    try:
        prompt = template.render(messages)
    except ChatTemplateError as e:
        raise InvalidRequest("messages", str(e)) from None
    size = utf8_bytes(prompt)
    if size > limits.max_prompt_bytes:
        raise InvalidRequest("messages", too_long(f"the chat template renders them as {size}", limits))
    return prompt


def utf8_bytes(text: str) -> int:
    """len(text.encode()), without encoding an ASCII text (str.isascii reads a flag: no scan, no copy)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def too_long(size: str, limits: RequestLimits) -> str:
    """The prompt byte bound's refusal, as the session's `validate` words it for a text prompt."""
    return (
        f"{size} UTF-8 bytes, more than any {limits.max_prompt_tokens} tokens can hold "
        f"(the limit is {limits.max_prompt_bytes} bytes)"
    )


def response_schema(response_format: Any) -> Any:
    """OpenAI's response_format as a JSON schema for guided_json (None: free text)."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema" and isinstance(response_format.get("json_schema"), dict):
        schema = response_format["json_schema"].get("schema")
        if isinstance(schema, dict):
            return schema
    raise InvalidRequest(
        "response_format",
        'one of {"type": "text"}, {"type": "json_object"}, {"type": "json_schema", "json_schema": '
        '{"name": ..., "schema": {...}}}',
    )
