"""Request bytes that do not parse, sent with a plain gRPC channel (no generated stub) to every method
of every service the server speaks: INVALID_ARGUMENT naming the message type, counted in metrics, on
unary and streamed calls, with the token checked first, and the server serves on after."""

import grpc
import pytest
from fixtures_server import idle, request, start_server, wait_until

from attnserve.v1 import generation_pb2_grpc as pb_grpc

TIMEOUT = 10
IDENTITY = {"request_serializer": None, "response_deserializer": None}
# (path, kind, message type): every method of attnserve.v1, the inference protocol and grpc.health.v1.
METHODS = [
    ("/attnserve.v1.TextGeneration/Generate", "unary", "attnserve.v1.GenerateRequest"),
    ("/attnserve.v1.TextGeneration/GenerateStream", "server_stream", "attnserve.v1.GenerateRequest"),
    ("/attnserve.v1.TextGeneration/GetModelInfo", "unary", "attnserve.v1.GetModelInfoRequest"),
    ("/inference.GRPCInferenceService/ServerLive", "unary", "inference.ServerLiveRequest"),
    ("/inference.GRPCInferenceService/ServerReady", "unary", "inference.ServerReadyRequest"),
    ("/inference.GRPCInferenceService/ModelReady", "unary", "inference.ModelReadyRequest"),
    ("/inference.GRPCInferenceService/ServerMetadata", "unary", "inference.ServerMetadataRequest"),
    ("/inference.GRPCInferenceService/ModelMetadata", "unary", "inference.ModelMetadataRequest"),
    ("/inference.GRPCInferenceService/ModelInfer", "unary", "inference.ModelInferRequest"),
    ("/inference.GRPCInferenceService/ModelStreamInfer", "bidi", "inference.ModelInferRequest"),
    ("/grpc.health.v1.Health/Check", "unary", "grpc.health.v1.HealthCheckRequest"),
    ("/grpc.health.v1.Health/Watch", "server_stream", "grpc.health.v1.HealthCheckRequest"),
]
# Bytes that are not protobuf, whatever the message: a length-delimited field longer than the message,
# a truncated varint, an end-group tag with no group.
MALFORMED = [b"\x0a\x05ab", b"\x08\xff", b"\x0c"]


def call(channel: grpc.Channel, path: str, kind: str, messages: list[bytes], metadata=()):
    """Send raw request bytes; the status code and details."""
    try:
        if kind == "unary":
            channel.unary_unary(path, **IDENTITY)(messages[0], timeout=TIMEOUT, metadata=metadata)
        elif kind == "server_stream":
            list(channel.unary_stream(path, **IDENTITY)(messages[0], timeout=TIMEOUT, metadata=metadata))
        else:
            list(channel.stream_stream(path, **IDENTITY)(iter(messages), timeout=TIMEOUT, metadata=metadata))
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def count(server, method: str, code: str) -> float:
    labels = {"method": method, "code": code}
    return server.server.metrics.registry.get_sample_value("attnserve_requests_total", labels) or 0


@pytest.mark.parametrize(("path", "kind", "type_name"), METHODS, ids=[m[0].rsplit("/", 1)[-1] for m in METHODS])
def test_undecodable_bytes_are_invalid_argument(server, stub, path, kind, type_name):
    method = path.rsplit("/", 1)[-1]
    before = count(server, method, "INVALID_ARGUMENT")
    for data in MALFORMED:
        code, details = call(server.channel, path, kind, [data])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{path} {data!r}: {code} {details}"
        assert details.startswith(f"the request is not a valid {type_name} ({len(data)} bytes that do not parse")
    assert count(server, method, "INVALID_ARGUMENT") == before + len(MALFORMED)


def test_invalid_utf8_in_a_string_field_is_invalid_argument(server, stub):
    """GenerateRequest.prompt (field 1) is a proto3 string: its bytes must be UTF-8."""
    code, details = call(server.channel, METHODS[0][0], "unary", [b"\x0a\x02\xff\xfe"])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("the request is not a valid attnserve.v1.GenerateRequest")


def test_a_bad_message_later_in_a_request_stream_ends_it(server, stub):
    """ModelStreamInfer reads requests as they come: the one that does not parse ends the stream."""
    code, details = call(
        server.channel, "/inference.GRPCInferenceService/ModelStreamInfer", "bidi", [b"", b"", MALFORMED[0]]
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("the request is not a valid inference.ModelInferRequest")
    wait_until(lambda: idle(server.engine), what="the stream's requests to be released")


def test_the_server_serves_on_after_malformed_requests(server, stub):
    reference = stub.Generate(request("The ", max_new_tokens=12), timeout=TIMEOUT).text
    for path, kind, _ in METHODS:
        call(server.channel, path, kind, [MALFORMED[0]])
    assert stub.Generate(request("The ", max_new_tokens=12), timeout=TIMEOUT).text == reference
    assert count(server, "Generate", "INTERNAL") == count(server, "Generate", "UNKNOWN") == 0


def test_the_token_is_checked_before_the_bytes(tiny_model_dir, tmp_path):
    """An unauthenticated caller learns nothing about its bytes; health needs no token, as always."""
    (tmp_path / "token").write_text("s3cret\n")
    running = start_server(tiny_model_dir, auth_token_file=str(tmp_path / "token"))
    try:
        generate = "/attnserve.v1.TextGeneration/Generate"
        code, _ = call(running.channel, generate, "unary", [MALFORMED[0]])
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = call(running.channel, generate, "unary", [MALFORMED[0]], (("authorization", "Bearer s3cret"),))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        code, _ = call(running.channel, "/grpc.health.v1.Health/Check", "unary", [MALFORMED[0]])
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        ok = pb_grpc.TextGenerationStub(running.channel).Generate(
            request("a", max_new_tokens=2), timeout=TIMEOUT, metadata=(("authorization", "Bearer s3cret"),)
        )
        assert ok.usage.completion_tokens == 2
    finally:
        running.stop()
