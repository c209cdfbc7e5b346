"""OpenTelemetry tracing (--otlp-traces-endpoint) against a real OTLP receiver on 127.0.0.1
(opentelemetry-proto's TraceService served by grpcio, benchmarks/otlp_receiver.py): a streamed request
through each door (attnserve.v1, the Open Inference Protocol through tritonclient, the OpenAI API
through openai's client), each under a caller's W3C traceparent, gives one trace of two spans: the door's
server span as the caller's child, with events where validation ended and where the last write began,
and the engine core's span from its own process below it, with events where the queue and prefill
ended. A cancelled and a refused call give spans with their status; a collector that goes away fails
no request, and its lost spans are counted. The receiver prints a trace as a tree (its --print)."""

from __future__ import annotations

import json
import queue
import secrets
import time

import grpc
import numpy as np
import openai
import pytest
from fixtures_server import idle, release_once_ended, request, start_server, wait_until
from prometheus_client.openmetrics.exposition import generate_latest

from attnserve.v1 import generation_pb2 as pb

otlp = pytest.importorskip("benchmarks.otlp_receiver", reason="opentelemetry-proto comes with the [cpu] extra")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is a dev dependency")

TIMEOUT = 60
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR
CORE = {"engine_core"}


def caller() -> tuple[str, str, str]:
    """A caller's trace id, span id and the traceparent that carries them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


@pytest.fixture(scope="module")
def receiver():
    running = otlp.Receiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def traced(tiny_model_dir, receiver):
    """A server whose engine core runs in a process of its own, exporting to the receiver."""
    running = start_server(tiny_model_dir, engine_core="process", http_port=0, otlp_traces_endpoint=receiver.endpoint)
    yield running
    running.stop()


def by_name(spans) -> dict:
    return {s.name: s for s in spans}


def check_one_trace(spans, door: str, parent: str, request_id: str | None = None) -> None:
    """The door's span under the caller's, with its validated and final events; the core's span, from the
    core's process, under it, with its admitted and first_token events, all in order."""
    named = by_name(spans)
    assert len(spans) == 2, spans  # a request's trace is two spans: its door's and the engine core's
    top, core = named[door], named["engine_core"]
    assert top.parent_id == parent and top.kind == SERVER_KIND and top.status != ERROR, top
    assert core.parent_id == top.span_id, (core, top)
    assert core.resource["attnserve.process"] == "engine_core" and top.resource["attnserve.process"] == "front_end"
    assert core.resource["process.pid"] != top.resource["process.pid"]  # two processes, one trace
    assert [e for e in top.events] == ["validated", "final"] and core.events == ["admitted", "first_token"]
    validated, final = (top.event_ns[e] for e in top.events)
    admitted, first = (core.event_ns[e] for e in core.events)
    assert top.start_ns <= validated <= core.start_ns <= admitted <= first <= core.end_ns <= final <= top.end_ns
    a = core.attributes
    assert a["gen_ai.latency.e2e"] == pytest.approx((core.end_ns - core.start_ns) / 1e9, abs=2e-6)
    queue, prefill, decode = (
        a[f"gen_ai.latency.{k}"] for k in ("time_in_queue", "time_in_model_prefill", "time_in_model_decode")
    )
    assert (
        queue + prefill + decode == pytest.approx(a["gen_ai.latency.e2e"], abs=2e-6)
        and a["attnserve.prefill.chunks"] >= 1
    )
    assert top.attributes["gen_ai.usage.output_tokens"] == a["gen_ai.usage.output_tokens"] > 0
    assert top.attributes["gen_ai.request.model"] and top.attributes["gen_ai.request.max_tokens"] == 8
    assert top.attributes["attnserve.latency.last_write"] == pytest.approx((top.end_ns - final) / 1e9, abs=2e-6)
    if request_id is not None:
        assert top.attributes["gen_ai.response.id"] == a["gen_ai.response.id"] == request_id


def test_a_streamed_request_through_each_door_is_one_trace_across_both_processes(traced, receiver):
    # attnserve.v1
    trace_id, span_id, parent = caller()
    call = traced.stub.GenerateStream(
        request("The list", max_new_tokens=8, ignore_eos=True), timeout=TIMEOUT, metadata=(("traceparent", parent),)
    )
    replies = list(call)
    spans = receiver.wait_for(trace_id, {"attnserve.v1.TextGeneration/GenerateStream", *CORE})
    check_one_trace(spans, "attnserve.v1.TextGeneration/GenerateStream", span_id, replies[-1].request_id)
    exposition = generate_latest(traced.server.metrics.registry).decode()  # OpenMetrics: with exemplars
    assert f'# {{request_id="{replies[-1].request_id}",trace_id="{trace_id}"}}' in exposition or (
        f'# {{trace_id="{trace_id}",request_id="{replies[-1].request_id}"}}' in exposition
    ), [line for line in exposition.splitlines() if "request_latency" in line and "#" in line[1:]]
    v1 = by_name(spans)["attnserve.v1.TextGeneration/GenerateStream"]
    assert v1.attributes["rpc.grpc.status_code"] == 0 and v1.attributes["gen_ai.request.stream"] is True

    # the Open Inference Protocol, through Triton's client
    trace_id, span_id, parent = caller()
    client = grpcclient.InferenceServerClient(url=traced.target)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)), headers={"traceparent": parent})
    try:
        tensors = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("stream", [1], "BOOL")]
        tensors[0].set_data_from_numpy(np.array([b"The list"], dtype=np.object_))
        tensors[1].set_data_from_numpy(np.array([True], dtype=bool))
        sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        sampling.set_data_from_numpy(np.array([json.dumps({"max_tokens": 8, "ignore_eos": True})], dtype=np.object_))
        client.async_stream_infer(traced.server.info.model_name, [*tensors, sampling], request_id="oip-1")
        while True:
            result, error = results.get(timeout=TIMEOUT)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    door = "inference.GRPCInferenceService/ModelStreamInfer"
    check_one_trace(receiver.wait_for(trace_id, {door, *CORE}), door, span_id, "oip-1")

    # the OpenAI API, through OpenAI's client
    trace_id, span_id, parent = caller()
    url = f"http://127.0.0.1:{traced.server.http.port}/v1"
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT) as http:
        chunks = list(
            http.completions.create(
                model=traced.server.info.model_name,
                prompt="The list",
                max_tokens=8,
                stream=True,
                extra_body={"ignore_eos": True},
                extra_headers={"traceparent": parent},
            )
        )
    door = "POST /v1/completions"
    spans = receiver.wait_for(trace_id, {door, *CORE})
    check_one_trace(spans, door, span_id, chunks[0].id.removeprefix("cmpl-"))
    assert by_name(spans)[door].attributes["http.response.status_code"] == 200


@pytest.fixture(scope="module")
def paced(tiny_model_dir, receiver):
    """A server whose engine runs in its thread (paced by the tests), one slot and one queue place."""
    running = start_server(tiny_model_dir, max_batch=1, max_queue=1, otlp_traces_endpoint=receiver.endpoint)
    yield running
    running.stop()


def test_a_cancelled_and_a_refused_call_give_spans_with_their_status(paced, receiver):
    door = "attnserve.v1.TextGeneration/GenerateStream"
    cancelled_trace, cancelled_span, cancelled_parent = caller()
    held = request("The list", max_new_tokens=64, ignore_eos=True)
    paced.pacer.hold(when=lambda: paced.pacer.steps >= 2)  # the first stream stays in its slot
    first = paced.stub.GenerateStream(held, timeout=TIMEOUT, metadata=(("traceparent", cancelled_parent),))
    next(first)
    queued = paced.stub.GenerateStream(held, timeout=TIMEOUT)  # takes the one queue place
    wait_until(lambda: paced.server.engine.stats()["queued"] == 1, what="the second call to queue")

    refused_trace, refused_span, refused_parent = caller()
    with pytest.raises(grpc.RpcError) as refusal:
        list(paced.stub.GenerateStream(held, timeout=TIMEOUT, metadata=(("traceparent", refused_parent),)))
    assert refusal.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    first.cancel()
    queued.cancel()
    release_once_ended(paced)
    wait_until(lambda: idle(paced.server.engine), what="the server to go idle")

    refused = by_name(receiver.wait_for(refused_trace, {door}))[door]
    assert refused.parent_id == refused_span and refused.status == ERROR
    assert refused.message.startswith("RESOURCE_EXHAUSTED: the queue is full")
    assert refused.attributes["rpc.grpc.status_code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    spans = by_name(receiver.wait_for(cancelled_trace, {door, "engine_core"}))
    assert spans[door].parent_id == cancelled_span and spans[door].status == ERROR
    assert spans[door].message == "CANCELLED"
    core = spans["engine_core"]
    assert core.parent_id == spans[door].span_id and core.status == ERROR and core.message == "cancelled"
    assert 0 < core.attributes["gen_ai.usage.output_tokens"] < 64


def dropped(running, process: str) -> float:
    registry = running.server.metrics.registry
    return registry.get_sample_value("attnserve_trace_spans_dropped_total", {"process": process}) or 0


def test_a_collector_that_goes_away_fails_no_request_and_its_lost_spans_are_counted(tiny_model_dir, monkeypatch):
    """Both processes' exports fail once the receiver is gone (after the exporter's retries, within
    OTEL_EXPORTER_OTLP_TIMEOUT): every request still ends OK, and the metrics count the spans lost."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # seconds: the exporters' retries end sooner
    receiver = otlp.Receiver().start()
    running = start_server(tiny_model_dir, engine_core="process", otlp_traces_endpoint=receiver.endpoint)
    try:
        trace_id, _, parent = caller()
        running.stub.Generate(request("a", max_new_tokens=4), timeout=TIMEOUT, metadata=(("traceparent", parent),))
        receiver.wait_for(trace_id, {"engine_core", "attnserve.v1.TextGeneration/Generate"})
        receiver.stop()
        for i in range(8):
            reply = running.stub.Generate(request(f"{i}", max_new_tokens=4), timeout=TIMEOUT)
            assert reply.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS)
        # the core reports its losses with a step: a request a second until both processes' are counted
        for _ in range(60):
            if dropped(running, "front_end") > 0 and dropped(running, "engine_core") > 0:
                break
            assert running.stub.Generate(request("b", max_new_tokens=2), timeout=TIMEOUT).token_ids
            time.sleep(1)  # the exports fail on their own clock (a retry's back-off): poll it
        assert dropped(running, "front_end") > 0 and dropped(running, "engine_core") > 0
    finally:
        running.stop()


def test_attnserves_client_sends_the_callers_trace_context(traced, receiver):
    from attnserve.clients import Client

    trace_id, span_id, parent = caller()
    with Client(traced.target) as client:
        result = client.generate("The list", max_new_tokens=8, ignore_eos=True, traceparent=parent)
    door = "attnserve.v1.TextGeneration/Generate"
    check_one_trace(receiver.wait_for(trace_id, {door, *CORE}), door, span_id, result.request_id)


def test_bench_trace_sends_each_request_as_a_trace_of_its_own(traced, receiver):
    import asyncio

    from attnserve.clients.bench import BenchConfig, run_bench

    door = "attnserve.v1.TextGeneration/GenerateStream"
    before = {s.trace_id for s in receiver.spans if s.name == door}
    config = BenchConfig(target=traced.target, concurrency=(2,), requests=3, warmup=0, max_new_tokens=4, trace=True)
    (level,) = asyncio.run(run_bench(config))["levels"]
    assert level["completed"] == 3
    wait_until(lambda: len({s.trace_id for s in receiver.spans if s.name == door} - before) == 3, TIMEOUT, "3 traces")
    new = [s for s in receiver.spans if s.name == door and s.trace_id not in before]
    assert all(s.parent_id for s in new)  # each continues the traceparent bench sent: a parent span it made
    for span in new:
        core = by_name(receiver.wait_for(span.trace_id, {"engine_core"}))["engine_core"]
        assert core.parent_id == span.span_id


def test_a_callers_unsampled_trace_is_not_recorded_by_either_process(traced, receiver):
    """A traceparent whose sampled flag is off (the caller's sampler said no): the server writes no span of
    it, in either process. Each process exports in order, so once a later sampled request's two spans are
    in, an earlier unsampled one's would be too."""
    unsampled_trace, _, parent = caller()
    traced.stub.Generate(
        request("a", max_new_tokens=4), timeout=TIMEOUT, metadata=(("traceparent", parent[:-2] + "00"),)
    )
    trace_id, _, parent = caller()
    traced.stub.Generate(request("a", max_new_tokens=4), timeout=TIMEOUT, metadata=(("traceparent", parent),))
    receiver.wait_for(trace_id, {"attnserve.v1.TextGeneration/Generate", *CORE})
    assert receiver.trace(unsampled_trace) == []


def test_otlp_over_http_carries_both_processes_spans(tiny_model_dir):
    """An endpoint whose path ends in /v1/traces is OTLP over HTTP (protobuf bodies), in both processes."""
    receiver = otlp.Receiver().start_http()
    running = start_server(tiny_model_dir, engine_core="process", otlp_traces_endpoint=f"{receiver.endpoint}/v1/traces")
    try:
        trace_id, span_id, parent = caller()
        reply = running.stub.Generate(
            request("The list", max_new_tokens=8, ignore_eos=True), timeout=TIMEOUT, metadata=(("traceparent", parent),)
        )
        door = "attnserve.v1.TextGeneration/Generate"
        check_one_trace(receiver.wait_for(trace_id, {door, *CORE}), door, span_id, reply.request_id)
    finally:
        running.stop()
        receiver.stop()


def test_a_trace_prints_as_a_tree_of_its_spans_events_and_attributes(traced, receiver):
    """trace_tree (the receiver's --print) on a real trace: the door's span at the top (its parent, the
    caller's, is not in the trace), the engine core's below it, each with its events and attributes."""
    trace_id, _, parent = caller()
    reply = traced.stub.Generate(
        request("The list", max_new_tokens=4, ignore_eos=True), timeout=TIMEOUT, metadata=(("traceparent", parent),)
    )
    door = "attnserve.v1.TextGeneration/Generate"
    lines = otlp.trace_tree(receiver.wait_for(trace_id, {door, *CORE}))
    assert lines[0] == f"trace {trace_id}"
    assert lines[1].startswith(f"  {door}  [server, ") and lines[1].endswith(" ms, unset]")
    (core,) = [i for i, line in enumerate(lines) if line.startswith("    engine_core  [internal, ")]
    assert f"      gen_ai.response.id = '{reply.request_id}'" in lines[2:core]
    assert any(line.startswith("      event validated at +") for line in lines[2:core])
    assert f"        gen_ai.response.id = '{reply.request_id}'" in lines[core + 1 :]
    assert lines[core + 1].startswith("        event admitted at +")
    assert all(line.startswith("        ") for line in lines[core + 1 :])


def test_the_receiver_command_prints_each_trace_once_its_spans_stop_coming(tmp_path):
    """`python -m benchmarks.otlp_receiver --print`, sent two spans by OpenTelemetry's own SDK exporter."""
    import subprocess
    import sys

    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    command = [sys.executable, "-m", "benchmarks.otlp_receiver", "--port", "0", "--print", "--settle", "0.3"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        endpoint = proc.stdout.readline().split()[-1]
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
        tracer = provider.get_tracer("test")
        with (
            tracer.start_as_current_span("outer", attributes={"k": 7}) as outer,
            tracer.start_as_current_span("inner") as inner,
        ):
            inner.add_event("halfway")
        provider.shutdown()
        lines = [proc.stdout.readline().rstrip("\n") for _ in range(5)]
    finally:
        proc.kill()
        proc.wait()
    assert lines[0] == f"trace {outer.get_span_context().trace_id:032x}"
    assert lines[1].startswith("  outer  [internal, ") and lines[2] == "      k = 7"
    assert lines[3].startswith("    inner  [internal, ") and lines[4].startswith("        event halfway at +")
