"""Limits and errors at the gRPC boundary: each bad request names its field and limit, a full queue
is RESOURCE_EXHAUSTED, and cancelled or expired requests give their batch slot back."""

import gc

import grpc
import pytest
from fixtures_server import calls, idle, request, start_server, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.v1 import generation_pb2 as pb

TIMEOUT = 30
NAN, INF = float("nan"), float("inf")

# (case, request fields, field named in the message, limit named in the message); tiny: context 128, V 259
BAD_REQUESTS = [
    ("empty prompt", dict(prompt=""), "prompt", "empty"),
    ("prompt longer than the context", dict(prompt="x" * 200), "prompt", "127"),
    ("prompt + max_new_tokens over the context", dict(prompt="x" * 100, max_new_tokens=50), "prompt", "78"),
    ("max_new_tokens 0", dict(max_new_tokens=0), "max_new_tokens", "[1, 127]"),
    ("max_new_tokens negative", dict(max_new_tokens=-3), "max_new_tokens", "[1, 127]"),
    ("max_new_tokens over the cap", dict(max_new_tokens=1000), "max_new_tokens", "[1, 127]"),
    ("temperature negative", dict(temperature=-0.5), "temperature", "[0, 100]"),
    ("temperature NaN", dict(temperature=NAN), "temperature", "[0, 100]"),
    ("temperature infinite", dict(temperature=INF), "temperature", "[0, 100]"),
    ("temperature over 100", dict(temperature=101.0), "temperature", "[0, 100]"),
    ("top_k negative", dict(top_k=-1), "top_k", "[0, 259]"),
    ("top_k over the vocabulary", dict(top_k=100000), "top_k", "[0, 259]"),
    ("top_p zero", dict(top_p=0.0), "top_p", "(0, 1]"),
    ("top_p over one", dict(top_p=1.5), "top_p", "(0, 1]"),
    ("top_p NaN", dict(top_p=NAN), "top_p", "(0, 1]"),
    ("repetition_penalty zero", dict(repetition_penalty=0.0), "repetition_penalty", "(0, 100]"),
    ("repetition_penalty negative", dict(repetition_penalty=-1.0), "repetition_penalty", "(0, 100]"),
    ("repetition_penalty huge", dict(repetition_penalty=1e6), "repetition_penalty", "(0, 100]"),
    ("empty stop string", dict(stop=[""]), "stop[0]", "1 to 128"),
    ("stop string too long", dict(stop=["ab", "x" * 200]), "stop[1]", "1 to 128"),
    ("too many stop strings", dict(stop=["a"] * 17), "stop", "16"),
    ("request_id too long", dict(request_id="r" * 200), "request_id", "128"),
    ("request_id not printable", dict(request_id="a\nb"), "request_id", "printable"),
]


def bad(fields: dict) -> pb.GenerateRequest:
    return pb.GenerateRequest(**{"prompt": "hello", "max_new_tokens": 4, **fields})


@pytest.mark.parametrize("case, fields, field, limit", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_is_invalid_argument_naming_field_and_limit(stub, case, fields, field, limit):
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(bad(fields), timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details().startswith(f"{field}: "), info.value.details()
    assert limit in info.value.details(), info.value.details()


@pytest.mark.parametrize("fields", [dict(prompt=""), dict(top_p=2.0), dict(max_new_tokens=0)])
def test_bad_stream_request_fails_before_any_message(stub, fields):
    with pytest.raises(grpc.RpcError) as info:
        list(stub.GenerateStream(bad(fields), timeout=TIMEOUT))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_prompt_at_exactly_the_limit_is_accepted(stub):
    reply = stub.Generate(pb.GenerateRequest(prompt="x" * 77, max_new_tokens=50), timeout=TIMEOUT)  # 78 + 50 = 128
    assert reply.usage.prompt_tokens == 78


def test_after_the_bad_requests_the_server_serves_and_no_slot_leaked(stub, server):
    assert stub.Generate(request("still fine", max_new_tokens=5), timeout=TIMEOUT).usage.completion_tokens > 0
    wait_until(lambda: idle(server.engine), what="no active or queued requests")


@pytest.fixture(scope="module")
def single(tiny_model_dir):
    """A server that decodes one request at a time and queues two; each test holds its engine
    while the long request decodes (hold_while_decoding), so that the request cannot end first."""
    running = start_server(tiny_model_dir, max_batch=1, max_queue=2)
    yield running
    running.stop()


def long_request(**fields) -> pb.GenerateRequest:
    return request("a long one", max_new_tokens=100, **fields)


def hold_while_decoding(single) -> None:
    """From now, the engine holds at its first step with a request decoding, until released."""
    single.pacer.hold(when=lambda: single.engine.stats()["active"] == 1)


def decoding_and_held(single) -> None:
    """Wait until the engine holds with the long request in its only slot (it cannot end meanwhile)."""
    wait_until(single.pacer.held.is_set, what="the engine to hold with the long request decoding")


def finished(server, reason: str) -> float:
    registry = server.server.metrics.registry
    return registry.get_sample_value("attnserve_generations_finished_total", {"reason": reason}) or 0


def test_full_queue_is_resource_exhausted_and_health_stays_serving(single):
    hold_while_decoding(single)
    running = single.stub.Generate.future(long_request())
    decoding_and_held(single)
    queued = [single.stub.Generate.future(request("queued", max_new_tokens=3)) for _ in range(2)]
    wait_until(lambda: single.engine.stats()["queued"] == 2, what="two queued requests")
    with pytest.raises(grpc.RpcError) as info:
        single.stub.Generate(request("one too many", max_new_tokens=3), timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max-queue" in info.value.details()
    health = health_pb2_grpc.HealthStub(single.channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    for call in [running, *queued]:
        call.cancel()
    single.pacer.release()
    wait_until(lambda: idle(single.engine), what="cancelled requests to leave")


def live_call_contexts() -> int:
    """grpc.aio's per-call context objects alive in this process, unreachable ones included."""
    return sum(type(o).__name__ == "_ServicerContext" for o in gc.get_objects())


def test_refused_calls_are_freed_at_once_not_by_the_cycle_collector(single):
    """A refused call (full queue, bad request) leaves no reference cycle behind: gRPC core counts a
    call's HTTP/2 stream against --max-concurrent-streams until the call is freed, and refuses new
    streams (UNAVAILABLE to clients) once a connection holds more, so a cycle per refusal made an
    overloaded server answer UNAVAILABLE. With the queue full a call is refused before it is read,
    so a bad request is RESOURCE_EXHAUSTED then, and INVALID_ARGUMENT once there is room."""
    gc.disable()  # only reference counting frees objects now
    try:
        hold_while_decoding(single)
        running = single.stub.Generate.future(long_request())
        decoding_and_held(single)
        queued = [single.stub.Generate.future(request("queued", max_new_tokens=3)) for _ in range(2)]
        wait_until(lambda: single.engine.stats()["queued"] == 2, what="two queued requests")
        before = live_call_contexts()
        stream = lambda message, timeout: list(single.stub.GenerateStream(message, timeout=timeout))

        def refusals(message) -> set:
            codes = set()
            for _ in range(10):
                for call in (single.stub.Generate, stream):
                    with pytest.raises(grpc.RpcError) as info:
                        call(message, timeout=TIMEOUT)
                    codes.add(info.value.code())
            return codes

        bad = request("bad", max_new_tokens=1000)
        assert refusals(request("one too many", max_new_tokens=3)) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert refusals(bad) == {grpc.StatusCode.RESOURCE_EXHAUSTED}  # refused unread
        for call in [running, *queued]:
            call.cancel()
        single.pacer.release()
        wait_until(lambda: idle(single.engine), what="cancelled requests to leave")
        assert refusals(bad) == {grpc.StatusCode.INVALID_ARGUMENT}
        wait_until(lambda: live_call_contexts() <= before, what=f"the 60 refused calls freed (alive: {before} before)")
    finally:
        gc.enable()


def test_calls_refused_while_draining_are_freed_at_once_too(single):
    """The start-up and drain refusals end a call the same way as a mapped error, not with abort()."""
    from attnserve.server.app import DRAINING

    gc.disable()
    single.server.boundary.refusal = DRAINING
    try:
        before = live_call_contexts()
        stream = lambda message, timeout: list(single.stub.GenerateStream(message, timeout=timeout))
        for _ in range(10):
            for call in (single.stub.Generate, stream):
                with pytest.raises(grpc.RpcError) as info:
                    call(request("too late", max_new_tokens=2), timeout=TIMEOUT)
                assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, DRAINING)
        wait_until(lambda: live_call_contexts() <= before, what=f"the 20 refused calls freed (alive: {before} before)")
        assert calls(single, "GenerateStream", "UNAVAILABLE") >= 10
    finally:
        single.server.boundary.refusal = None
        gc.enable()


def test_cancelled_stream_frees_its_slot_for_a_queued_request(single):
    cancelled = finished(single, "cancelled")
    hold_while_decoding(single)
    stream = single.stub.GenerateStream(long_request(), timeout=TIMEOUT)
    next(stream)  # decoding has begun
    decoding_and_held(single)
    waiting = single.stub.Generate.future(request("waiting", max_new_tokens=3), timeout=TIMEOUT)
    wait_until(lambda: single.engine.stats()["queued"] == 1, what="the second request to queue")
    ended = calls(single, "GenerateStream", "CANCELLED")
    stream.cancel()
    # The server has seen the cancel before the engine goes on (once, on a busy machine, the engine
    # decoded all 100 tokens before the cancel arrived, and the request ended by its length).
    wait_until(lambda: calls(single, "GenerateStream", "CANCELLED") == ended + 1, what="the server to see the cancel")
    single.pacer.release()
    reply = waiting.result(timeout=TIMEOUT)
    assert finished(single, "cancelled") == cancelled + 1  # the long one left by its cancel, not its end
    assert reply.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS)
    wait_until(lambda: idle(single.engine), what="no active or queued requests")


def test_deadline_frees_the_slot_and_the_caller_gets_deadline_exceeded(single):
    hold_while_decoding(single)
    doomed = single.stub.Generate.future(long_request(), timeout=0.3)
    decoding_and_held(single)
    waiting = single.stub.Generate.future(request("after the deadline", max_new_tokens=3), timeout=TIMEOUT)
    assert doomed.exception(timeout=TIMEOUT).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    single.pacer.release()
    assert waiting.result(timeout=TIMEOUT).usage.completion_tokens >= 0
    wait_until(lambda: idle(single.engine), what="no active or queued requests")


def test_deadline_while_queued_leaves_the_queue(single):
    hold_while_decoding(single)
    running = single.stub.Generate.future(long_request())
    decoding_and_held(single)
    queued = single.stub.Generate.future(request("queued", max_new_tokens=3), timeout=0.2)
    assert queued.exception(timeout=TIMEOUT).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: single.engine.stats()["queued"] == 0, what="the expired request to leave the queue")
    running.cancel()
    single.pacer.release()
    wait_until(lambda: idle(single.engine), what="no active or queued requests")


def test_cancellations_and_errors_are_counted_by_status(single):
    counts = {
        (s.labels["method"], s.labels["code"]): s.value
        for metric in single.server.metrics.registry.collect()
        if metric.name == "attnserve_requests"
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert counts[("Generate", "RESOURCE_EXHAUSTED")] >= 1
    assert counts[("GenerateStream", "CANCELLED")] >= 1
    assert counts[("Generate", "DEADLINE_EXCEEDED")] >= 1


def test_unexpected_error_is_internal_with_a_request_id_and_no_detail(tiny_model_dir, caplog):
    running = start_server(tiny_model_dir)
    runner = running.engine.slots.decoder  # the arena's driver: every ONNX Runtime run goes through it
    real_run = runner.run

    def broken_run(*args, **kwargs):
        raise RuntimeError("secret detail /srv/models/x.onnx at 10.0.0.7")

    try:
        runner.run = broken_run  # a fault inside the engine, as a bug would raise
        with caplog.at_level("ERROR", logger="attnserve.server"), pytest.raises(grpc.RpcError) as info:
            running.stub.Generate(request("boom", max_new_tokens=3, request_id="req-42"), timeout=TIMEOUT)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "req-42" in info.value.details()
        assert "secret" not in info.value.details() and "/srv" not in info.value.details()
        assert "req-42" in caplog.text and "secret detail" in caplog.text
        runner.run = real_run
        reply = running.stub.Generate(request("recovered", max_new_tokens=3), timeout=TIMEOUT)
        assert reply.usage.prompt_tokens == 10
        wait_until(lambda: idle(running.engine), what="no active or queued requests")
    finally:
        runner.run = real_run
        running.stop()
