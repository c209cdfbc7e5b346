"""A request as a caller asked for it, whatever the door: one plain, typed value that each door builds
at its edge (from attnserve.v1's protobuf, from the Open Inference Protocol's tensors and parameters,
from OpenAI's JSON) and the session's `validate` checks. Its fields are attnserve.v1's names; None
(or empty) is a field the caller left out. `origins` names a field as the caller sent it, so that an
error names what the caller wrote (`sampling_parameters.max_tokens` for max_new_tokens). A field
one door alone speaks is a field here, not a protocol change. No gRPC, no HTTP, no protobuf.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ...engine.domain import InvalidRequest
from ...request_fields import RANGES, problems

STRUCTURE_KINDS = ("json_schema", "regex")


@dataclass(frozen=True)
class Structure:
    """structured_output: a JSON schema or a regular expression (kind None: the caller set neither)."""

    kind: str | None
    source: str = ""


@dataclass(frozen=True)
class RequestFields:
    """What one caller asked for (see the module's docstring); attnserve.v1's GenerateRequest documents each field."""

    prompt: str = ""
    prompt_token_ids: tuple[int, ...] = ()
    request_id: str = ""
    max_new_tokens: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    min_new_tokens: int | None = None
    ignore_eos: bool = False
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    priority: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int | None = None
    structured_output: Structure | None = None
    num_beams: int | None = None
    length_penalty: float | None = None
    early_stopping: str | None = None
    num_return_sequences: int | None = None
    stream_interval_tokens: int | None = None
    stream_interval_ms: int | None = None
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

    def named(self, name: str) -> str:
        """The field `name` as the caller sent it."""
        return origin(name, self.origins)


FIELD_NAMES = frozenset(f.name for f in fields(RequestFields)) - {"origins"}


def check_ranges(request: RequestFields) -> None:
    """InvalidRequest naming the first field (or list element, or logit_bias entry) outside the ranges
    that need no model (attnserve/request_ranges.py: the client's command line checks the same). A
    range the server narrows is left to validation's narrower check."""
    for name, bound in RANGES.items():
        if bound.narrowed:
            continue
        for where, problem in problems(name, getattr(request, name)):
            raise InvalidRequest(request.named(where), problem)


def renamed(error: InvalidRequest, origins: Mapping[str, str]) -> InvalidRequest:
    """An error naming a field by another name: the name the caller sent it under (stop[1] -> ...stop[1])."""
    where = origin(error.field, origins)
    return error if where == error.field else InvalidRequest(where, error.problem)


def origin(name: str, origins: Mapping[str, str]) -> str:
    """`name` (maybe with an index: stop[1]) as `origins` renames its field; itself where they do not."""
    base, bracket, index = name.partition("[")
    return f"{origins.get(base, base)}{bracket}{index}"
