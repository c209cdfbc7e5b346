"""An Open Inference Protocol request, read the way Triton's vLLM backend reads it, as a GenerateRequest.

Inputs: `text_input` (BYTES, the prompt), `stream` (BOOL), `sampling_parameters` (BYTES, a JSON
object of vLLM's SamplingParams names), `exclude_input_in_output` (BOOL) and the `return_*` BOOLs
that add outputs. The sampling fields are also taken as request parameters (the tensor wins on a
clash). The result is an attnserve.v1 GenerateRequest, so `validation.validate` checks it like any
other; its errors are renamed to the field the caller sent (`max_new_tokens` -> the
`sampling_parameters.max_tokens` it came from). No gRPC, no engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..engine.domain import InvalidRequest
from ..inference import grpc_service_pb2 as oip
from ..v1 import generation_pb2 as pb
from .oip_tensors import BOOL, BYTES, UINT32, TensorSpec, parameter_value, read_inputs

TEXT_INPUT, STREAM, SAMPLING = "text_input", "stream", "sampling_parameters"
EXCLUDE_INPUT = "exclude_input_in_output"
TEXT_OUTPUT, FINISH_REASON = "text_output", "finish_reason"
NUM_INPUT, NUM_OUTPUT = "num_input_tokens", "num_output_tokens"
# return_<output> asks for an output beside text_output, as the vLLM backend's flags do.
RETURN_FLAGS = {f"return_{name}": name for name in (FINISH_REASON, NUM_INPUT, NUM_OUTPUT)}

INPUTS = {
    spec.name: spec
    for spec in (
        TensorSpec(TEXT_INPUT, BYTES),
        TensorSpec(STREAM, BOOL),
        TensorSpec(SAMPLING, BYTES),
        TensorSpec(EXCLUDE_INPUT, BOOL),
        *(TensorSpec(flag, BOOL) for flag in RETURN_FLAGS),
    )
}
OUTPUTS = {
    spec.name: spec
    for spec in (
        TensorSpec(TEXT_OUTPUT, BYTES),
        TensorSpec(FINISH_REASON, BYTES),
        TensorSpec(NUM_INPUT, UINT32),
        TensorSpec(NUM_OUTPUT, UINT32),
    )
}


def as_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError
    return int(value)


def as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError
    return float(value)


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


def as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError
    return value


# vLLM's SamplingParams names (and attnserve's stream interval) -> (GenerateRequest field, parser, what it takes).
SAMPLING_FIELDS: dict[str, tuple[str, Callable[[Any], Any], str]] = {
    "max_tokens": ("max_new_tokens", as_int, "an integer"),
    "temperature": ("temperature", as_float, "a number"),
    "top_k": ("top_k", as_int, "an integer (-1 or 0: all tokens)"),
    "top_p": ("top_p", as_float, "a number"),
    "repetition_penalty": ("repetition_penalty", as_float, "a number"),
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
}
LIST_FIELDS = frozenset({"stop", "stop_token_ids"})  # GenerateRequest's repeated fields, filled by extend
# Request parameters that Triton's clients send for Triton itself; they carry no sampling field (a
# Triton `priority` parameter is Triton's scheduling knob; attnserve's is sampling_parameters.priority).
TRITON_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"})


@dataclass(frozen=True)
class InferCall:
    """What one ModelInferRequest asks for."""

    request: pb.GenerateRequest
    stream: bool  # a response per delta (ModelStreamInfer only)
    prepend_prompt: bool  # text_output starts with the prompt (not exclude_input_in_output)
    outputs: tuple[str, ...]  # the output tensors each response carries, in order
    origins: dict[str, str]  # GenerateRequest field -> the name the caller sent it under


def read_call(request: oip.ModelInferRequest) -> InferCall:
    """The request as an attnserve GenerateRequest and the response's shape; InvalidRequest names the tensor."""
    values = read_inputs(request, INPUTS)
    if TEXT_INPUT not in values:
        raise InvalidRequest(TEXT_INPUT, "missing: the prompt goes in a BYTES tensor of one element")
    stream = values.get(STREAM, False)
    prepend = not values.get(EXCLUDE_INPUT, stream)
    if stream and prepend:
        raise InvalidRequest(EXCLUDE_INPUT, "false is not allowed when streaming (deltas never repeat the prompt)")
    fields, origins = sampling_fields(request, values.get(SAMPLING))
    generate = pb.GenerateRequest(prompt=values[TEXT_INPUT], request_id=request.id)
    origins.update(prompt=TEXT_INPUT, request_id="id")
    fill(generate, fields, origins)
    return InferCall(generate, stream, prepend, requested_outputs(request, values), origins)


def fill(generate: pb.GenerateRequest, fields: dict[str, Any], origins: dict[str, str]) -> None:
    """Set GenerateRequest fields (by name, as SAMPLING_FIELDS gives them) on `generate`; a value the
    protobuf field cannot hold is InvalidRequest naming where it came from."""
    for name, value in fields.items():
        try:
            if name in LIST_FIELDS:
                getattr(generate, name).extend(value)
            elif name == "logit_bias":
                generate.logit_bias.update(value)
            elif name.startswith("structured_output."):
                if generate.HasField("structured_output"):
                    raise InvalidRequest(origins[name], "give guided_json or guided_regex, not both")
                setattr(generate.structured_output, name.partition(".")[2], value)
            else:
                setattr(generate, name, value)
        except (ValueError, TypeError):
            raise InvalidRequest(origins[name], f"{value!r} is out of range") from None


def sampling_fields(request: oip.ModelInferRequest, tensor_json: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """GenerateRequest fields from the request parameters, then the sampling_parameters tensor."""
    given: dict[str, tuple[Any, str]] = {}
    for key, parameter in request.parameters.items():
        if key in TRITON_PARAMETERS or key.startswith("triton_"):
            continue
        given[key] = (parameter_value(parameter), f"parameters.{key}")
    if tensor_json is not None:
        try:
            parsed = json.loads(tensor_json) if tensor_json.strip() else {}
        except json.JSONDecodeError as e:
            raise InvalidRequest(SAMPLING, f"not JSON: {e.msg} at character {e.pos}") from None
        if not isinstance(parsed, dict):
            raise InvalidRequest(SAMPLING, f"a JSON object is expected, not {type(parsed).__name__}")
        given.update({key: (value, f"{SAMPLING}.{key}") for key, value in parsed.items()})
    fields: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key, (value, where) in given.items():
        if key not in SAMPLING_FIELDS:
            raise InvalidRequest(where, f"unknown sampling field (known: {', '.join(SAMPLING_FIELDS)})")
        name, parsed_value = parse_field(SAMPLING_FIELDS, key, value, where)
        fields[name], origins[name] = parsed_value, where
    return fields, origins


NON_NEGATIVE = frozenset({"seed", "min_tokens", "n", "logprobs", "prompt_logprobs"})


def parse_field(known: dict[str, tuple[str, Callable[[Any], Any], str]], key: str, value: Any, where: str):
    """(GenerateRequest field, value) of the sampling field `key` (one of `known`), or InvalidRequest
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


def requested_outputs(request: oip.ModelInferRequest, values: dict[str, Any]) -> tuple[str, ...]:
    """The outputs named in the request, else text_output plus those the return_* flags ask for."""
    if request.outputs:
        names = []
        for i, output in enumerate(request.outputs):
            if output.name not in OUTPUTS:
                known = ", ".join(OUTPUTS)
                raise InvalidRequest(f"outputs[{i}]", f"unknown output {output.name!r} (this model has {known})")
            names.append(output.name)
        return tuple(names)
    return (TEXT_OUTPUT, *(output for flag, output in RETURN_FLAGS.items() if values.get(flag)))


def renamed(error: InvalidRequest, origins: dict[str, str]) -> InvalidRequest:
    """validate()'s error, naming the tensor or parameter the field came from (stop[1] -> ...stop[1])."""
    base, bracket, index = error.field.partition("[")
    where = origins.get(base)
    if where is None:
        return error
    return InvalidRequest(f"{where}{bracket}{index}", error.problem)
