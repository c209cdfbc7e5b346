"""The table of request fields (attnserve/request_fields.py) and every list it stands for agree: the
.proto's GenerateRequest, the session's RequestFields, the clients' GenerationParams, the Open
Inference Protocol's and the OpenAI door's name tables. Each disagreement is named; editing one of
them alone fails here (the tests below edit the table and show it)."""

from __future__ import annotations

import dataclasses
from dataclasses import fields

import pytest
from google.protobuf.descriptor import FieldDescriptor

from attnserve.clients.types import GenerationParams
from attnserve.request_fields import FIELDS, OPTIONAL, RequestField
from attnserve.request_ranges import INT32_MAX, INT32_MIN, UINT32_MAX, Range
from attnserve.server.grpc_oip.request import TEXT_INPUT
from attnserve.server.http_openai.request import CHAT_OWN, OWN
from attnserve.server.http_openai.request import FIELDS as OPENAI_FIELDS
from attnserve.server.session.request import FIELD_NAMES as SESSION_FIELDS
from attnserve.server.session.vllm_names import SAMPLING_FIELDS
from attnserve.v1 import generation_pb2 as pb

PROTO = {f.name: f for f in pb.GenerateRequest.DESCRIPTOR.fields}
OIP_OWN = {TEXT_INPUT, "id"}  # the prompt's tensor and the request's id, not sampling parameters
BEAM_SWITCHES = {"use_beam_search", "best_of"}  # vLLM's names that together set num_beams
FLOATS = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE}
BOUNDS = {  # the proto's integer types' ranges
    FieldDescriptor.TYPE_UINT32: (0, UINT32_MAX),
    FieldDescriptor.TYPE_INT32: (INT32_MIN, INT32_MAX),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def disagreements(table: tuple[RequestField, ...]) -> list[str]:
    """Every way `table` and the lists it stands for disagree, one line each."""
    found = []
    names = [f.name for f in table]
    if set(names) != set(PROTO):
        extra, missing = sorted(set(PROTO) - set(names)), sorted(set(names) - set(PROTO))
        found.append(f"the proto's GenerateRequest has {extra} and not {missing}")
    if set(names) != SESSION_FIELDS:
        found.append(
            f"RequestFields has {sorted(SESSION_FIELDS - set(names))} and not {sorted(set(names) - SESSION_FIELDS)}"
        )
    client = {name for f in table for name in f.client_fields}
    params = {f.name for f in fields(GenerationParams)}
    if client != params:
        found.append(f"GenerationParams has {sorted(params - client)} and not {sorted(client - params)}")
    for f in table:
        proto = PROTO.get(f.name)
        if proto is not None and proto.has_presence != f.optional:
            found.append(f"{f.name}: the proto's presence is {proto.has_presence}, the table's optional {f.optional}")
        if proto is not None and f.range is not None:
            found += range_problems(f, proto)
    found += door_problems(table)
    return found


def range_problems(field: RequestField, proto: FieldDescriptor) -> list[str]:
    """A float field's range is in floats, an integer field's in integers inside the proto's type."""
    bound = field.range
    assert bound is not None
    if field.name == "logit_bias":
        return []  # its range is the biases' (the map's values), its ids are token ids
    if proto.type in FLOATS:
        return [] if isinstance(bound.high, float) else [f"{field.name}: a float field with an integer range"]
    low, high = BOUNDS[proto.type]
    if isinstance(bound.high, float) or not low <= bound.low <= bound.high <= high:
        return [f"{field.name}: its range {bound} is not inside its proto type's [{low}, {high}]"]
    return []


def door_problems(table: tuple[RequestField, ...]) -> list[str]:
    """The doors' name tables: each name a door parses belongs to the row that names it, and no row
    names what no door parses."""
    found = []
    oip = names_of(table, "oip")
    if set(oip) - OIP_OWN != set(SAMPLING_FIELDS):
        found.append(
            f"sampling_parameters parses {sorted(set(SAMPLING_FIELDS) - set(oip))} not in the table, "
            f"the table names {sorted(set(oip) - OIP_OWN - set(SAMPLING_FIELDS))} it does not parse"
        )
    openai = names_of(table, "openai")
    spoken = set(OPENAI_FIELDS) | OWN | CHAT_OWN
    if not set(OPENAI_FIELDS) <= set(openai) or not set(openai) <= spoken:
        found.append(
            f"the OpenAI door parses {sorted(set(OPENAI_FIELDS) - set(openai))} not in the table, "
            f"the table names {sorted(set(openai) - spoken)} it does not parse"
        )
    parsers = {**SAMPLING_FIELDS, **OPENAI_FIELDS}
    for door in (oip, openai):
        for name, rows in door.items():
            if name not in parsers or name in BEAM_SWITCHES:
                continue  # the door's own names; vLLM's beam names are read together (vllm_names.beam_fields)
            target = parsers[name][0].partition(".")[0]
            if target not in rows:
                found.append(f"{name} sets {target}, the table says {' or '.join(sorted(rows))}")
    return found


def names_of(table: tuple[RequestField, ...], door: str) -> dict[str, set[str]]:
    """A door's names -> the rows that name them (OpenAI's prompt is text or ids, its n beams' too)."""
    rows: dict[str, set[str]] = {}
    for f in table:
        for name in getattr(f, door):
            rows.setdefault(name, set()).add(f.name)
    return rows


def test_the_table_and_every_list_it_stands_for_agree():
    assert disagreements(FIELDS) == []


def edited(name: str, table: tuple[RequestField, ...] = FIELDS, **changes) -> tuple[RequestField, ...]:
    return tuple(dataclasses.replace(f, **changes) if f.name == name else f for f in table)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        (
            edited("length_penalty", optional=False),
            "length_penalty: the proto's presence is True, the table's optional False",
        ),
        (tuple(f for f in FIELDS if f.name != "seed"), "the proto's GenerateRequest has ['seed'] and not []"),
        (
            edited("min_new_tokens", oip=("min_new_tokens",)),
            "sampling_parameters parses ['min_tokens'] not in the table",
        ),
        (edited("top_k", oip=("top_p",)), "sampling_parameters parses ['top_k'] not in the table"),
        (edited("top_k", edited("top_p", oip=("top_k",)), oip=("top_p",)), "top_p sets top_p, the table says top_k"),
        (edited("n", client=("n", "best_of")), "GenerationParams has [] and not ['best_of']"),
        (edited("priority", range=Range(INT32_MIN, 2**40)), "priority: its range [-2147483648, 1099511627776]"),
    ],
)
def test_one_list_edited_alone_is_named(table, named):
    """The issue's case first: length_penalty's `optional` left out of one list, and v1 callers would
    silently get the default."""
    assert any(line.startswith(named) for line in disagreements(table)), disagreements(table)


def test_the_optional_fields_are_the_protos_and_the_clients_leave_them_unset():
    assert set(OPTIONAL) == {f.name for f in PROTO.values() if f.has_presence and f.message_type is None}
    request = GenerationParams().request("x")
    assert not any(request.HasField(name) for name in OPTIONAL)
    request = GenerationParams(length_penalty=0.0, min_new_tokens=0).request("x")
    assert request.HasField("length_penalty") and request.HasField("min_new_tokens")
