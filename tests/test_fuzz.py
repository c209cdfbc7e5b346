"""Property-based requests (hypothesis) against a live server: every GenerateRequest field at and
beyond its limits (read from GetModelInfo, not written here), the Open Inference Protocol's tensors
and parameters, and random bytes sent to every method of every service. Every answer must be a
designated status (OK, INVALID_ARGUMENT, NOT_FOUND, or RESOURCE_EXHAUSTED if the queue is full),
never UNKNOWN or INTERNAL, an OK answer must be coherent, and the server must serve the same greedy
text after as before. derandomize=True: the cases are the same on every run, so CI is reproducible."""

import json
import struct

import grpc
import pytest
from fixtures_server import idle, request, start_server, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server_malformed import METHODS, call

from attnserve.inference import grpc_service_pb2 as oip
from attnserve.inference import grpc_service_pb2_grpc as oip_grpc
from attnserve.v1 import generation_pb2 as pb

# A numeric warning in the engine (overflow, NaN) becomes an error there, so the request ends INTERNAL
# and the case fails: a garbage token must not pass as an answer.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
TIMEOUT = 30
DESIGNATED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def live(tiny_model_dir):
    """A server of its own (the cases fill its metrics), and the greedy text it gives before fuzzing."""
    running = start_server(tiny_model_dir, max_batch=8, max_queue=64, metrics_port=0)
    running.reference = running.stub.Generate(request("The ", max_new_tokens=16), timeout=TIMEOUT).text
    running.limits = running.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT).limits
    yield running
    running.stop()


def around(limit: int | float) -> st.SearchStrategy:
    """Values at, just inside and just beyond a limit, and far beyond it either way."""
    return st.sampled_from([limit - 1, limit, limit + 1, 0, -1, 2**31 - 1, -(2**31)])


def fields(limits) -> st.SearchStrategy[dict]:
    """GenerateRequest fields, each absent, within its limits, at them, or beyond them."""
    floats = st.floats(allow_nan=True, allow_infinity=True, width=32)
    small = st.integers(1, 6)
    return st.fixed_dictionaries(
        {},
        optional={
            "prompt": st.text(max_size=2 * limits.max_prompt_tokens),
            "prompt_token_ids": st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 600), max_size=140),
            "max_new_tokens": small | around(limits.max_new_tokens),
            "temperature": floats | st.sampled_from([0.0, 0.7, 100.0, 100.01]),
            "top_k": st.integers(-(2**31), 2**31 - 1) | st.integers(0, 600),
            "top_p": floats | st.sampled_from([0.0, 0.5, 1.0, 1.0001]),
            "repetition_penalty": floats | st.sampled_from([0.0, 1.0, 100.0]),
            "seed": st.integers(0, 2**64 - 1),
            "stop": st.lists(st.text(max_size=limits.max_stop_bytes + 8), max_size=limits.max_stop_sequences + 2),
            "request_id": st.text(max_size=140) | st.just("x" * 129),
            "stream_interval_tokens": st.integers(0, 2**32 - 1)
            | around(limits.max_new_tokens).filter(lambda v: v >= 0),
            "stream_interval_ms": st.integers(0, 2**32 - 1) | st.sampled_from([0, 60000, 60001]),
        },
    )


def capped(values: dict) -> dict:
    """A valid-looking request generates a few tokens at most, so thousands of cases stay quick."""
    new = values.get("max_new_tokens")
    if new is None or 0 < new <= 6:
        values = {**values, "max_new_tokens": new or 4}
    return values


def send(live, message: pb.GenerateRequest, streamed: bool):
    """Generate or GenerateStream; the status, its details, and the messages received."""
    try:
        if streamed:
            return grpc.StatusCode.OK, "", list(live.stub.GenerateStream(message, timeout=TIMEOUT))
        return grpc.StatusCode.OK, "", [live.stub.Generate(message, timeout=TIMEOUT)]
    except grpc.RpcError as error:
        return error.code(), error.details(), []


def check_answer(message, code, details, replies, max_new_tokens: int) -> None:
    assert code in DESIGNATED, f"{code} {details!r} for {message}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert details and ":" in details, f"no field named in {details!r} for {message}"
    if code == grpc.StatusCode.OK:
        final = replies[-1]
        tokens = [t for r in replies for t in r.token_ids]
        assert final.finish_reason != pb.FINISH_REASON_UNSPECIFIED, message
        assert final.usage.completion_tokens == len(tokens) <= max_new_tokens, message


@settings(FUZZ, max_examples=700)
@given(data=st.data(), streamed=st.booleans())
def test_generate_requests_at_and_beyond_their_limits(live, data, streamed):
    values = capped(data.draw(fields(live.limits)))
    message = pb.GenerateRequest(**values)
    code, details, replies = send(live, message, streamed)
    check_answer(message, code, details, replies, values["max_new_tokens"])


@settings(FUZZ, max_examples=1200)
@given(method=st.sampled_from(METHODS), data=st.binary(max_size=64))
def test_random_bytes_to_every_method(live, method, data):
    """Random bytes often parse (protobuf keeps unknown fields): then the request is judged as sent."""
    path, kind, _ = method
    if path.endswith("/Watch"):
        return  # a Watch that parses stays open: tests/test_server_malformed.py covers its bad bytes
    code, details = call(live.channel, path, kind, [data])
    assert code in DESIGNATED | {grpc.StatusCode.NOT_FOUND}, f"{path} {data!r}: {code} {details}"


def tensor_cases(model: str) -> st.SearchStrategy[oip.ModelInferRequest]:
    """ModelInferRequests with right and wrong names, datatypes, shapes, contents and parameters."""
    names = st.sampled_from(["text_input", "stream", "sampling_parameters", "exclude_input_in_output", "bogus"])
    datatypes = st.sampled_from(["BYTES", "BOOL", "INT32", "FP32", "UINT8", ""])
    shapes = st.lists(st.integers(-2, 3), max_size=3)
    sampling = st.dictionaries(
        st.sampled_from(["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "bogus"]),
        st.integers(-5, 300) | st.floats(allow_nan=False, width=32) | st.text(max_size=5) | st.none(),
        max_size=4,
    ).map(json.dumps) | st.text(max_size=20)
    contents = st.one_of(
        st.binary(max_size=24),
        st.text(max_size=12).map(lambda t: struct.pack("<I", len(t.encode())) + t.encode()),
        sampling.map(lambda t: struct.pack("<I", len(t.encode())) + t.encode()),
    )
    tensor = st.tuples(names, datatypes, shapes, contents)

    def build(model_name, tensors, max_tokens):
        message = oip.ModelInferRequest(model_name=model_name)
        for name, datatype, shape, raw in tensors:
            message.inputs.add(name=name, datatype=datatype, shape=shape)
            message.raw_input_contents.append(raw)
        if max_tokens is not None:
            message.parameters["max_tokens"].int64_param = max_tokens
        return message

    valid_text = st.just([("text_input", "BYTES", [1], struct.pack("<I", 4) + b"The ")])
    return st.builds(
        build,
        st.sampled_from([model, model, "other"]),
        st.lists(tensor, max_size=4) | valid_text,
        st.none() | st.sampled_from([1, 4, 0, -1, 10**6]),
    )


@settings(FUZZ, max_examples=500)
@given(data=st.data())
def test_protocol_tensors_and_parameters(live, data):
    message = data.draw(tensor_cases(live.server.info.model_name))
    if not message.parameters.get("max_tokens"):
        message.parameters["max_tokens"].int64_param = 4  # keep accepted requests short
    try:
        oip_grpc.GRPCInferenceServiceStub(live.channel).ModelInfer(message, timeout=TIMEOUT)
    except grpc.RpcError as error:
        code, details = error.code(), error.details()
        assert code in DESIGNATED | {grpc.StatusCode.NOT_FOUND}, f"{code} {details!r} for {message}"
        assert details, message


def test_after_the_fuzzing_the_server_serves_as_before(live):
    """Run last in this file: the engine is idle, the same greedy text comes back, and no call of
    any method ended UNKNOWN or INTERNAL."""
    wait_until(lambda: idle(live.engine), TIMEOUT, "the engine to go idle")
    assert live.stub.Generate(request("The ", max_new_tokens=16), timeout=TIMEOUT).text == live.reference
    registry = live.server.metrics.registry
    codes = {s.labels["code"] for m in registry.collect() for s in m.samples if s.name == "attnserve_requests_total"}
    assert "OK" in codes and "INVALID_ARGUMENT" in codes
    assert not codes & {"UNKNOWN", "INTERNAL"}, codes
    assert registry.get_sample_value("attnserve_requests_in_flight") == 0
