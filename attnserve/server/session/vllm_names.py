"""vLLM's names for a request's fields and its finish reasons, read by the doors that speak them: the
Open Inference Protocol's sampling_parameters (as Triton's vLLM backend reads them) and the
OpenAI-compatible HTTP API's JSON body. Each name maps to a RequestFields field, a parser and
what it takes; an error names the field as the caller sent it. No gRPC, no HTTP.
"""

from __future__ import annotations

import array
import json
from collections.abc import Callable
from typing import Any

from ...engine.domain import FinishReason, InvalidRequest
from .request import RequestFields, Structure

# vLLM's finish reasons: the end-of-sequence token is a "stop" there too. (A passed deadline is no
# finish: the door answers it with its deadline error.)
FINISH_REASONS = {
    FinishReason.LENGTH: "length",
    FinishReason.STOP: "stop",
    FinishReason.EOS: "stop",
    FinishReason.CANCELLED: "abort",
}


def as_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError
    return int(value)


def as_float(value: Any) -> float:
    """A number, rounded to 32 bits as attnserve.v1's float fields hold it (so that a request gives the
    same tokens through every door); beyond float32's range, infinite (refused by the checks)."""
    if isinstance(value, bool):
        raise ValueError
    return array.array("f", [float(value)])[0]


def as_stops(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ValueError
    return stops


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "True", "false", "False"):
        return value in ("true", "True")
    raise ValueError


def as_ids(value: Any) -> list[int]:
    if not isinstance(value, list):
        raise ValueError
    return [as_int(v) for v in value]


def as_bias(value: Any) -> dict[int, float]:
    """OpenAI's and vLLM's logit_bias: a JSON object of token id (a string key) -> bias."""
    if not isinstance(value, dict):
        raise ValueError
    return {as_int(int(key)): as_float(bias) for key, bias in value.items()}


def as_schema(value: Any) -> str:
    """vLLM's guided_json: a JSON schema as an object, or as its JSON text."""
    if isinstance(value, dict):
        return json.dumps(value)
    if not isinstance(value, str):
        raise ValueError
    return value


def as_early_stopping(value: Any) -> str:
    """vLLM's early_stopping: true, false or "never" (transformers'), as attnserve.v1's string."""
    if value == "never":
        return value
    return "true" if as_bool(value) else "false"


def as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError
    return value


# vLLM's SamplingParams names (and attnserve's stream interval) -> (RequestFields field, parser, what it takes).
SAMPLING_FIELDS: dict[str, tuple[str, Callable[[Any], Any], str]] = {
    "max_tokens": ("max_new_tokens", as_int, "an integer"),
    "temperature": ("temperature", as_float, "a number"),
    "top_k": ("top_k", as_int, "an integer (-1 or 0: all tokens)"),
    "top_p": ("top_p", as_float, "a number"),
    "min_p": ("min_p", as_float, "a number"),
    "repetition_penalty": ("repetition_penalty", as_float, "a number"),
    "presence_penalty": ("presence_penalty", as_float, "a number"),
    "frequency_penalty": ("frequency_penalty", as_float, "a number"),
    "seed": ("seed", as_int, "a non-negative integer"),
    "stop": ("stop", as_stops, "a string or a list of strings"),
    "stream_interval_tokens": ("stream_interval_tokens", as_int, "an integer"),
    "stream_interval_ms": ("stream_interval_ms", as_int, "an integer"),
    "stop_token_ids": ("stop_token_ids", as_ids, "a list of integers"),
    "min_tokens": ("min_new_tokens", as_int, "a non-negative integer"),
    "ignore_eos": ("ignore_eos", as_bool, "true or false"),
    "logit_bias": ("logit_bias", as_bias, 'an object of token id -> bias, e.g. {"50": -100}'),
    "priority": ("priority", as_int, "an integer (higher is admitted first)"),
    "guided_json": ("structured_output.json_schema", as_schema, "a JSON schema (an object or its JSON text)"),
    "guided_regex": ("structured_output.regex", as_str, "a string (a regular expression)"),
    # vLLM's beam search (its SamplingParams before 0.6.3): best_of beams, the n best hypotheses returned
    "use_beam_search": ("use_beam_search", as_bool, "true or false"),
    "best_of": ("best_of", as_int, "an integer"),
    "length_penalty": ("length_penalty", as_float, "a number"),
    "early_stopping": ("early_stopping", as_early_stopping, 'true, false or "never"'),
}
LIST_FIELDS = frozenset({"stop", "stop_token_ids"})  # RequestFields' tuples


def request_of(fields: dict[str, Any], origins: dict[str, str], **given: Any) -> RequestFields:
    """RequestFields from values named as SAMPLING_FIELDS names them (where each came from in
    `origins`) and the door's own fields in `given` (the prompt, the request id)."""
    values = dict(given)
    fields = beam_fields(dict(fields), origins)
    for name, value in fields.items():
        if name.startswith("structured_output."):
            if "structured_output" in values:
                raise InvalidRequest(origins[name], "give guided_json or guided_regex, not both")
            values["structured_output"] = Structure(name.partition(".")[2], value)
        else:
            values[name] = tuple(value) if name in LIST_FIELDS else value
    return RequestFields(**values, origins=origins)


def beam_fields(fields: dict[str, Any], origins: dict[str, str]) -> dict[str, Any]:
    """vLLM's beam search names as attnserve.v1's: with use_beam_search, best_of (else n) beams and the
    n best hypotheses returned; without it, best_of only equal to n (one completion per sample)."""
    use, best_of = fields.pop("use_beam_search", False), fields.pop("best_of", None)
    if not use:
        if best_of is not None and best_of != fields.get("n", 1):
            where = origins.get("best_of", "best_of")
            raise InvalidRequest(where, f"{best_of!r} is not supported without use_beam_search (only best_of = n)")
        return fields
    fields["num_beams"] = best_of if best_of is not None else fields.get("n", 1)
    origins["num_beams"] = origins.get("best_of" if best_of is not None else "n", "best_of")
    if "n" in fields:
        fields["num_return_sequences"], origins["num_return_sequences"] = fields.pop("n"), origins.get("n", "n")
    return fields


NON_NEGATIVE = frozenset({"seed", "min_tokens", "n", "logprobs", "prompt_logprobs"})


def parse_field(known: dict[str, tuple[str, Callable[[Any], Any], str]], key: str, value: Any, where: str):
    """(RequestFields field, value) of the sampling field `key` (one of `known`), or InvalidRequest
    naming `where` it came from; vLLM's top_k -1 is all tokens, as 0 is here."""
    name, parse, takes = known[key]
    try:
        parsed = parse(value)
    except (ValueError, TypeError, OverflowError):
        raise InvalidRequest(where, f"{value!r} is not {takes}") from None
    if key == "top_k" and parsed == -1:
        parsed = 0
    if key in NON_NEGATIVE and parsed < 0:
        raise InvalidRequest(where, f"{parsed} is not a non-negative integer")
    return name, parsed
