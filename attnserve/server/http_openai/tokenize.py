"""vLLM's POST /tokenize and POST /detokenize bodies, read and bounded; and their answers. No HTTP,
no engine: the door hands in the JSON body and the tokenizer.

    /tokenize    {"prompt": TEXT, "add_special_tokens": true, "return_token_strs": false, "model": NAME}
                 -> {"count": N, "max_model_len": CONTEXT, "tokens": [IDS], "token_strs": [TEXTS] or null}
    /detokenize  {"tokens": [IDS], "model": NAME} -> {"prompt": TEXT}

`add_special_tokens` puts BOS before the text where a prompt gets it (the model's tokenizer says);
`token_strs` is each id's own text. A `model` is optional, as vLLM's; given, it must be the served one
(the door checks). The text is bounded by the longest prompt's bytes, the ids by the context length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...engine.domain import InvalidRequest
from ...tokenizer import Tokenizer
from ..session.validation import RequestLimits

TOKENIZE_FIELDS = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


@dataclass(frozen=True)
class TokenizeCall:
    text: str
    add_special_tokens: bool
    return_token_strs: bool


def read_tokenize(body: Any, limits: RequestLimits) -> TokenizeCall:
    """The /tokenize body; InvalidRequest names the field and its bound."""
    known(body, TOKENIZE_FIELDS)
    text = body.get("prompt")
    if not isinstance(text, str):
        raise InvalidRequest("prompt", "required: the text to tokenize (a string)")
    if len(text.encode("utf-8", "surrogatepass")) > limits.max_prompt_bytes:
        raise InvalidRequest("prompt", f"longer than the longest prompt: {limits.max_prompt_bytes} UTF-8 bytes")
    return TokenizeCall(text, flag(body, "add_special_tokens", True), flag(body, "return_token_strs", False))


def tokenized(call: TokenizeCall, tokenizer: Tokenizer, context_length: int) -> dict[str, Any]:
    """vLLM's TokenizeResponse."""
    ids = tokenizer.encode_prompt(call.text) if call.add_special_tokens else tokenizer.encode(call.text)
    strs = [tokenizer.decode([i]) for i in ids] if call.return_token_strs else None
    return {"count": len(ids), "max_model_len": context_length, "tokens": ids, "token_strs": strs}


def read_detokenize(body: Any, limits: RequestLimits) -> list[int]:
    """The /detokenize body's ids; InvalidRequest names the field and its bound."""
    known(body, DETOKENIZE_FIELDS)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InvalidRequest("tokens", "required: a list of token ids (integers)")
    if len(ids) > limits.context_length:
        raise InvalidRequest("tokens", f"{len(ids)} ids, more than the context length {limits.context_length}")
    wrong = next((i for i in ids if not 0 <= i < limits.vocab_size), None)
    if wrong is not None:
        raise InvalidRequest("tokens", f"id {wrong} is outside [0, {limits.vocab_size})")
    return ids


def known(body: Any, fields: frozenset[str]) -> None:
    """InvalidRequest unless `body` is a JSON object of `fields` only."""
    if not isinstance(body, dict):
        raise InvalidRequest("body", f"a JSON object is expected, not {type(body).__name__}")
    unknown = sorted(set(body) - fields)
    if unknown:
        shown = unknown[0] if len(unknown[0]) <= 80 else f"{unknown[0][:80]}..."  # a client's string, not echoed whole
        raise InvalidRequest(shown, f"unknown field (this route takes {', '.join(sorted(fields))})")


def flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise InvalidRequest(name, "must be true or false")
    return value
