"""The request session every door shares (attnserve/server/session/): one plain request value, checked
by one validate whose errors name the field as the caller sent it, whichever door read it."""

import asyncio
import json
import re

import pytest

from attnserve.engine.domain import Delta, Final, FinishReason, InvalidRequest, Timings, Usage
from attnserve.inference import grpc_service_pb2 as oip
from attnserve.server.grpc_oip.request import read_call
from attnserve.server.grpc_v1.request import request_fields
from attnserve.server.http_openai.request import read_completion
from attnserve.server.session.events import messages
from attnserve.server.session.request import RequestFields, Structure
from attnserve.server.session.validation import RequestLimits, check_stream_interval, validate
from attnserve.tokenizer.utf8 import ByteTokenizer
from attnserve.v1 import generation_pb2 as pb

TOKENIZER = ByteTokenizer()
LIMITS = RequestLimits(context_length=64, vocab_size=TOKENIZER.vocab_size, max_new_tokens=32)


def refusal(request: RequestFields) -> tuple[str, str]:
    with pytest.raises(InvalidRequest) as refused:
        validate(request, LIMITS, TOKENIZER)
    return refused.value.field, refused.value.problem


def oip_call(**sampling) -> oip.ModelInferRequest:
    """A ModelInferRequest of the prompt "hello", its sampling fields in the sampling_parameters tensor."""
    request = oip.ModelInferRequest(model_name="m", id="r1")
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(b"hello")
    tensor = request.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(json.dumps(sampling).encode())
    return request


def test_the_three_doors_read_one_request_the_same():
    """The same request through attnserve.v1's protobuf, the Open Inference Protocol's parameters and
    OpenAI's JSON is one GenerationRequest."""
    asked = {"seed": 7, "top_k": 3, "temperature": 0.7, "top_p": 0.9, "min_p": 0.05}
    asked |= {"presence_penalty": 0.5, "frequency_penalty": -0.25}
    v1 = request_fields(pb.GenerateRequest(prompt="hello", request_id="r1", max_new_tokens=5, **asked))
    call = read_call(oip_call(max_tokens=5, **asked))
    body = {"model": "m", "prompt": "hello", "max_tokens": 5, **asked}
    openai = read_completion(body).request
    generations = [validate(r, LIMITS, TOKENIZER) for r in (v1, call.request, openai)]
    assert generations[0] == generations[1]
    assert generations[0].sampling == generations[2].sampling
    sampling = generations[0].sampling
    assert (sampling.min_p, sampling.presence_penalty, sampling.frequency_penalty) == pytest.approx((0.05, 0.5, -0.25))
    assert generations[0].prompt_ids == generations[2].prompt_ids == tuple(TOKENIZER.encode_prompt("hello"))


@pytest.mark.parametrize(
    ("door", "named"),
    [
        (lambda value: read_call(oip_call(priority=value)).request, "sampling_parameters.priority"),
        (lambda value: read_completion({"model": "m", "prompt": "x", "priority": value}).request, "priority"),
    ],
    ids=["oip", "openai"],
)
def test_an_integer_outside_its_wire_type_is_refused_naming_the_field_as_sent(door, named):
    """A JSON number has no width: a value attnserve.v1's int32 could not hold is refused, naming the
    field as the caller sent it, by the ranges the client's command line checks too."""
    assert refusal(door(2**31)) == (named, f"{2**31} is outside [-2147483648, 2147483647]")
    assert validate(door(2**31 - 1), LIMITS, TOKENIZER).priority == 2**31 - 1


def test_a_field_one_door_renames_is_named_as_its_caller_wrote_it():
    call = read_call(oip_call(max_tokens=33))
    field, problem = refusal(call.request)
    assert field == "sampling_parameters.max_tokens" and problem.startswith("33 is outside [1, 32]")
    openai = read_completion({"model": "m", "prompt": "x", "stop_token_ids": [1, 99999]}).request
    assert refusal(openai)[0] == "stop_token_ids[1]"
    paced = read_completion({"model": "m", "prompt": "x", "stream": True, "stream_interval_ms": -1}).request
    assert refusal(paced) == ("stream_interval_ms", "-1 is outside [0, 60000]")
    too_many = read_completion({"model": "m", "prompt": "x", "stream": True, "stream_interval_tokens": 33}).request
    with pytest.raises(InvalidRequest, match=re.escape("stream_interval_tokens: 33 is outside [1, 32]")):
        check_stream_interval(too_many, LIMITS)


@pytest.mark.parametrize(
    "field, value",
    [("min_p", 0.1), ("presence_penalty", 0.5), ("frequency_penalty", -0.5), ("repetition_penalty", 1.2)],
)
def test_beam_search_refuses_each_sampling_field_beside_it_naming_it(field, value):
    request = RequestFields(prompt="x", num_beams=2, **{field: value})
    assert refusal(request) == (field, "beam search (num_beams 2) decodes without it")
    assert validate(RequestFields(prompt="x", num_beams=2), LIMITS, TOKENIZER).beams is not None


def test_structured_output_without_a_kind_is_refused():
    assert refusal(RequestFields(prompt="x", structured_output=Structure(None))) == (
        "structured_output",
        "set json_schema or regex",
    )


def test_a_streams_messages_are_one_per_completion_per_batch_in_index_order():
    """The engine holds each completion's tokens to the stream interval; a batch of its events becomes
    one message per completion in it, its deltas together and its Final with them."""
    end = Final(FinishReason.LENGTH, "!", Usage(1, 3), Timings(0.0, 1.0, 2.0), index=1)
    batches = [[Delta((1,), "a", index=1), Delta((2,), "b"), Delta((3,), "c", index=1), end], [Delta((4,), "d")]]

    async def taken():
        async def source():
            for batch in batches:
                yield batch

        return [message async for message in messages(source())]

    assert asyncio.run(taken()) == [
        (0, [Delta((2,), "b")], None),
        (1, [Delta((1,), "a", index=1), Delta((3,), "c", index=1)], end),
        (0, [Delta((4,), "d")], None),
    ]
