"""docs/reference/request-fields.md: every field of a request, by the name each door takes it under,
with its limits, what leaving it out means and what it does.

Read from the table of request fields (attnserve/request_fields.py) and the field types of
attnserve.v1's GenerateRequest as the generated protocol module declares them. Knows nothing of what
the fields do beyond the table's words.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor

from attnserve.request_fields import FIELDS, RequestField
from attnserve.v1 import generation_pb2 as pb

from .markdown import code, page, table, text

INTRO = (
    "A request's fields, one row each, by the name each door takes them under: attnserve.v1's "
    "`GenerateRequest` (the gRPC API, and the Python client's `GenerationParams`, whose fields are "
    "these names but for `structured_output`, its `json_schema` and `regex`), the Open Inference "
    "Protocol's `sampling_parameters` JSON (vLLM's names, as Triton's vLLM backend reads them; its "
    "prompt is the `text_input` tensor, its request id the request's `id`) and "
    "the OpenAI-compatible JSON body (`/v1/completions`, and `/v1/chat/completions`, which reads "
    "`messages`, `max_completion_tokens`, `logprobs` with `top_logprobs`, and `response_format` "
    "as shown). A limit named `limits.*` is the server's, in `ModelInfo.limits`. A value outside its "
    "limits is refused (INVALID_ARGUMENT, or 400 on the HTTP door) with a message that names the field "
    "as the caller sent it and the limit; `attnserve generate` and `bench` check the limits that need "
    "no model before sending. The OpenAI door's own defaults are OpenAI's: `max_tokens` 16, "
    "`temperature` 1. vLLM's beam search is `use_beam_search` with `best_of` beams, the `n` best "
    "hypotheses returned."
)
SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT64: "uint64",
}


def render() -> str:
    declared = {f.name: f for f in pb.GenerateRequest.DESCRIPTOR.fields}
    rows = [row(f, declared[f.name]) for f in FIELDS]
    header = ["attnserve.v1", "type", "Open Inference Protocol", "OpenAI body", "limits", "unset", "what"]
    return page("Request fields", INTRO, [table(header, rows)])


def row(field: RequestField, declared: FieldDescriptor) -> list[str]:
    return [
        code(field.name),
        code(type_of(declared)),
        names(field.oip),
        names(field.openai),
        text(field.limits),
        text(field.unset),
        text(field.help),
    ]


def names(found: tuple[str, ...]) -> str:
    return ", ".join(map(code, found)) or "—"


def type_of(fd: FieldDescriptor) -> str:
    """The type as the .proto writes it: `optional float`, `repeated string`, `map<uint32, float>`."""
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        key, value = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        return f"map<{type_of(key)}, {type_of(value)}>"
    name = fd.message_type.name if fd.message_type is not None else SCALARS[fd.type]
    if fd.label == FieldDescriptor.LABEL_REPEATED:
        return f"repeated {name}"
    return f"optional {name}" if fd.has_presence and fd.message_type is None else name
