"""attnserve.v1's GenerateRequest as the session's RequestFields: proto3's unset optional fields as None."""

from __future__ import annotations

from ...request_fields import OPTIONAL
from ...v1 import generation_pb2 as pb
from ..session.request import RequestFields, Structure


def request_fields(message: pb.GenerateRequest) -> RequestFields:
    structure = None
    if message.HasField("structured_output"):
        kind = message.structured_output.WhichOneof("kind")
        structure = Structure(kind, getattr(message.structured_output, kind) if kind else "")
    return RequestFields(
        prompt=message.prompt,
        prompt_token_ids=tuple(message.prompt_token_ids),
        request_id=message.request_id,
        temperature=message.temperature,
        top_k=message.top_k,
        stop=tuple(message.stop),
        stop_token_ids=tuple(message.stop_token_ids),
        ignore_eos=message.ignore_eos,
        logit_bias=dict(message.logit_bias),
        priority=message.priority,
        structured_output=structure,
        early_stopping=message.early_stopping or None,
        **{name: getattr(message, name) for name in OPTIONAL if message.HasField(name)},
    )
