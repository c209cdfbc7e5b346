"""An Open Inference Protocol request, read the way Triton's vLLM backend reads it, as the session's RequestFields.

Inputs: `text_input` (BYTES, the prompt), `stream` (BOOL), `sampling_parameters` (BYTES, a JSON
object of vLLM's SamplingParams names), `exclude_input_in_output` (BOOL) and the `return_*` BOOLs
that add outputs. The sampling fields are also taken as request parameters (the tensor wins on a
clash; vLLM's names are read by session/vllm_names.py). The result is the session's
RequestFields, which `validate` checks like any other door's, naming the field the caller sent
(`sampling_parameters.max_tokens`, not max_new_tokens). No gRPC, no engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...engine.domain import InvalidRequest
from ...inference import grpc_service_pb2 as oip
from ..session.request import RequestFields
from ..session.vllm_names import SAMPLING_FIELDS, parse_field, request_of
from .tensors import BOOL, BYTES, UINT32, TensorSpec, parameter_value, read_inputs

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


# Request parameters that Triton's clients send for Triton itself; they carry no sampling field (a
# Triton `priority` parameter is Triton's scheduling knob; attnserve's is sampling_parameters.priority).
TRITON_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"})


@dataclass(frozen=True)
class InferCall:
    """What one ModelInferRequest asks for."""

    request: RequestFields
    stream: bool  # a response per delta (ModelStreamInfer only)
    prepend_prompt: bool  # text_output starts with the prompt (not exclude_input_in_output)
    outputs: tuple[str, ...]  # the output tensors each response carries, in order


def read_call(request: oip.ModelInferRequest) -> InferCall:
    """The request as the session's RequestFields and the response's shape; InvalidRequest names the tensor."""
    values = read_inputs(request, INPUTS)
    if TEXT_INPUT not in values:
        raise InvalidRequest(TEXT_INPUT, "missing: the prompt goes in a BYTES tensor of one element")
    stream = values.get(STREAM, False)
    prepend = not values.get(EXCLUDE_INPUT, stream)
    if stream and prepend:
        raise InvalidRequest(EXCLUDE_INPUT, "false is not allowed when streaming (deltas never repeat the prompt)")
    fields, origins = sampling_fields(request, values.get(SAMPLING))
    origins.update(prompt=TEXT_INPUT, request_id="id")
    generate = request_of(fields, origins, prompt=values[TEXT_INPUT], request_id=request.id)
    return InferCall(generate, stream, prepend, requested_outputs(request, values))


def sampling_fields(request: oip.ModelInferRequest, tensor_json: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """RequestFields' fields from the request parameters, then the sampling_parameters tensor."""
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
        except RecursionError:
            raise InvalidRequest(SAMPLING, "JSON nested too deep") from None
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
