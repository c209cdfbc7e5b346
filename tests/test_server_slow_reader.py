"""Clients that stop reading their stream, against a real server: a request whose client falls
--stream-buffer-events behind is cancelled and its slot freed, the stuck call ends after
--write-timeout (CANCELLED, counted, nothing left in flight), and streams that read are unhurt."""

import asyncio
import statistics
import threading
import time

import grpc
import pytest
from fixtures_server import idle, request, start_server, wait_until

from attnserve.engine.domain import Delta, Final, FinishReason, GenerationRequest, SlowReader, Timings, Usage
from attnserve.engine.sequence import Handle
from attnserve.inference import grpc_service_pb2 as oip
from attnserve.inference import grpc_service_pb2_grpc as oip_grpc
from attnserve.v1 import generation_pb2_grpc as pb_grpc

TIMEOUT = 60
BUFFER = 8  # --stream-buffer-events
WRITE_TIMEOUT = 3.0  # --write-timeout, seconds: past the second a stuck stream's slot is kept
# A client that stops reading: HTTP/2 flow control then holds the server's writes once the client's
# window (here about 1 KiB: no BDP probing to grow it) is full of unread messages.
STALLED = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
LONG_ID = "x" * 100  # echoed in every message: the window fills within a few messages
STALLED_STEP = 0.02  # seconds per token: a stalled 120-token request outlasts the cap's second by far


@pytest.fixture(scope="module")
def strict(tiny_model_dir):
    running = start_server(
        tiny_model_dir, max_batch=4, stream_buffer_events=BUFFER, write_timeout=WRITE_TIMEOUT, metrics_port=0
    )
    yield running
    running.stop()


@pytest.fixture
def paced(strict):
    strict.pacer.delay = 0.004  # wall time is the subject (a reader's patience, gaps): a token every ~4 ms
    yield strict
    strict.pacer.reset()
    wait_until(lambda: idle(strict.engine) and gauge(strict, "attnserve_requests_in_flight") == 0, TIMEOUT)


def gauge(server, name: str, labels: dict | None = None) -> float:
    return server.server.metrics.registry.get_sample_value(name, labels or {}) or 0


def finished(server, reason: str) -> float:
    return gauge(server, "attnserve_generations_finished_total", {"reason": reason})


def cancelled_calls(server, method: str) -> float:
    return gauge(server, "attnserve_requests_total", {"method": method, "code": "CANCELLED"})


def test_the_buffer_cap_cancels_a_request_its_caller_does_not_read():
    """Handle.put: deltas past the cap become SlowReader and a cancel; the engine's later Final is dropped."""

    async def fill() -> list:
        generation = GenerationRequest("r", (1, 2), 10)
        handle = Handle(generation, asyncio.get_running_loop(), max_buffered=3, patience_s=0)
        for token in range(5):
            handle.put(Delta((token,), "t"))
        handle.put(Final(FinishReason.CANCELLED, "", Usage(2, 5), Timings(0, 0, 0)))
        assert handle.cancelled and handle.finished
        return await handle.next_events()

    events = asyncio.run(fill())
    assert [type(e) for e in events] == [Delta, Delta, Delta, SlowReader]
    assert "3 decoded events waited" in str(events[-1]) and "--stream-buffer-events" in str(events[-1])


def test_a_caller_waiting_for_events_is_never_behind_however_many_arrive_at_once():
    """An event loop that was busy runs several engine deliveries in one go before the caller's turn:
    a caller waiting in next_events gets them all, and its request is not dropped (a unary call's
    caller is the server itself, and was once cancelled as a slow reader on a busy machine)."""

    async def burst() -> list:
        generation = GenerationRequest("r", (1, 2), 10)
        handle = Handle(generation, asyncio.get_running_loop(), max_buffered=3)
        waiting = asyncio.create_task(handle.next_events())
        await asyncio.sleep(0)  # the caller now waits for its first event
        deliveries = [Delta((token,), "t") for token in range(8)]
        handle.loop.call_soon(lambda: [handle.put(event) for event in deliveries])  # one loop iteration
        events = await waiting
        assert not handle.cancelled
        return events

    events = asyncio.run(burst())
    assert [e.token_ids for e in events] == [(token,) for token in range(8)]


def test_a_burst_delivered_while_the_caller_is_just_away_is_kept():
    """A starved event loop runs many deliveries while the caller's write is pending, moments
    before it completes: late, not stuck. The cap applies once the caller has been away a second."""

    async def burst_then_stall() -> tuple[list, list]:
        loop = asyncio.get_running_loop()
        handle = Handle(GenerationRequest("r", (1, 2), 200), loop, max_buffered=3, patience_s=1.0)
        for token in range(64):
            handle.put(Delta((token,), "t"))
        burst = await handle.next_events()
        handle.away_since = loop.time() - 1.0  # the caller's next write has been held a second
        for token in range(5):
            handle.put(Delta((token,), "t"))
        return burst, await handle.next_events()

    burst, stalled = asyncio.run(burst_then_stall())
    assert [e.token_ids for e in burst] == [(token,) for token in range(64)]
    assert [type(e) for e in stalled] == [Delta, Delta, Delta, SlowReader]
    assert "3 decoded events waited 1 s" in str(stalled[-1])


def test_a_stalled_stream_frees_its_slot_then_ends_after_the_write_timeout(paced):
    paced.pacer.delay = STALLED_STEP
    cancelled, calls = finished(paced, "cancelled"), cancelled_calls(paced, "GenerateStream")
    with grpc.insecure_channel(paced.target, options=STALLED) as channel:
        stream = pb_grpc.TextGenerationStub(channel).GenerateStream(
            request("The ", max_new_tokens=120, request_id=LONG_ID), timeout=TIMEOUT
        )
        # Reading nothing: the slot is freed once BUFFER events wait behind a write held for a second,
        # long before 120 tokens.
        wait_until(lambda: finished(paced, "cancelled") == cancelled + 1, TIMEOUT, "the request to be cancelled")
        assert idle(paced.engine)
        wait_until(lambda: cancelled_calls(paced, "GenerateStream") == calls + 1, TIMEOUT, "the write timeout")
        assert gauge(paced, "attnserve_requests_in_flight") == 0
        received = []
        with pytest.raises(grpc.RpcError) as caught:
            for message in stream:  # the client wakes up: what was sent, then the status
                received.append(message)
    assert caught.value.code() == grpc.StatusCode.CANCELLED
    assert f"read nothing for {WRITE_TIMEOUT:g} s (--write-timeout)" in caught.value.details()
    assert 0 < sum(len(m.token_ids) for m in received) < 120


def test_a_client_that_hangs_up_while_its_write_is_held_ends_cancelled_not_internal(paced, caplog):
    """The write fails under the server (grpc.aio raises ExecuteBatchError before it cancels the call's
    task): the call is counted CANCELLED, nothing is logged as an internal error, and its slot is freed,
    for a client that cancels its call and for one that only closes its channel."""
    paced.pacer.delay = STALLED_STEP
    cancelled, calls = finished(paced, "cancelled"), cancelled_calls(paced, "GenerateStream")
    internal = {"method": "GenerateStream", "code": "INTERNAL"}
    before = gauge(paced, "attnserve_requests_total", internal)
    for ended, hang_up in enumerate(("cancel", "close"), start=1):
        channel = grpc.insecure_channel(paced.target, options=STALLED)
        stream = pb_grpc.TextGenerationStub(channel).GenerateStream(
            request("The ", max_new_tokens=120, request_id=LONG_ID), timeout=TIMEOUT
        )
        # The window is full and the server's write waits (well before the buffer cap's second).
        wait_until(lambda: len(paced.server.writes.writing) == 1, TIMEOUT, "a held write")
        if hang_up == "cancel":
            stream.cancel()
        channel.close()
        # This call ends before the next starts: a busy server still holding this one's write would
        # otherwise pass the next call's wait at once, and its channel close before the call was sent.
        wait_until(
            lambda n=calls + ended: cancelled_calls(paced, "GenerateStream") == n, TIMEOUT, f"the {hang_up} to end"
        )
    wait_until(lambda: finished(paced, "cancelled") == cancelled + 2, TIMEOUT, "both requests to be cancelled")
    assert gauge(paced, "attnserve_requests_total", internal) == before
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]
    assert idle(paced.engine) and gauge(paced, "attnserve_requests_in_flight") == 0


def test_a_stalled_protocol_stream_is_cut_the_same_way(paced):
    paced.pacer.delay = STALLED_STEP
    model = paced.server.info.model_name
    cancelled, calls = finished(paced, "cancelled"), cancelled_calls(paced, "ModelStreamInfer")
    text = oip.ModelInferRequest.InferInputTensor(name="text_input", datatype="BYTES", shape=[1])
    flag = oip.ModelInferRequest.InferInputTensor(name="stream", datatype="BOOL", shape=[1])
    infer = oip.ModelInferRequest(model_name=model, id=LONG_ID, inputs=[text, flag])
    infer.raw_input_contents.extend([len(b"The ").to_bytes(4, "little") + b"The ", b"\x01"])
    infer.parameters["max_tokens"].int64_param = 120
    with grpc.insecure_channel(paced.target, options=STALLED) as channel:
        stream = oip_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([infer]), timeout=TIMEOUT)
        wait_until(lambda: finished(paced, "cancelled") == cancelled + 1, TIMEOUT, "the request to be cancelled")
        wait_until(lambda: cancelled_calls(paced, "ModelStreamInfer") == calls + 1, TIMEOUT, "the write timeout")
        with pytest.raises(grpc.RpcError) as caught:
            list(stream)
    assert caught.value.code() == grpc.StatusCode.CANCELLED


def reading_stream(target: str, gaps: list[float]) -> str:
    """A stream read as fast as it comes; its text, and the gaps between its messages in `gaps`."""
    with grpc.insecure_channel(target) as channel:
        text, last = [], time.perf_counter()
        for message in pb_grpc.TextGenerationStub(channel).GenerateStream(
            request("The ", max_new_tokens=100), timeout=TIMEOUT
        ):
            now = time.perf_counter()
            gaps.append(now - last)
            text.append(message.text)
            last = now
    return "".join(text)


def stall(target: str, opened: threading.Event, done: threading.Event) -> None:
    with grpc.insecure_channel(target, options=STALLED) as channel:
        stream = pb_grpc.TextGenerationStub(channel).GenerateStream(
            request("a", max_new_tokens=120, request_id=LONG_ID), timeout=TIMEOUT
        )
        opened.set()
        done.wait(TIMEOUT)
        stream.cancel()


def test_streams_that_read_are_unhurt_by_three_that_do_not(paced):
    """Three stalled streams share the batch with one that reads: they are cut, it runs to its end
    with the same text, and its inter-token gaps stay those of a stream alone (medians, 2 rounds each)."""
    alone_gaps: list[float] = []
    reference = reading_stream(paced.target, alone_gaps)
    cancelled = finished(paced, "cancelled")
    beside_gaps: list[float] = []
    for _ in range(2):
        done = threading.Event()
        stalled = [threading.Event() for _ in range(3)]
        threads = [threading.Thread(target=stall, args=(paced.target, opened, done)) for opened in stalled]
        for thread in threads:
            thread.start()
        for opened in stalled:
            opened.wait(TIMEOUT)
        assert reading_stream(paced.target, beside_gaps) == reference
        done.set()
        for thread in threads:
            thread.join(TIMEOUT)
        reading_stream(paced.target, alone_gaps)
    assert finished(paced, "cancelled") == cancelled + 6
    alone, beside = statistics.median(alone_gaps[1:]), statistics.median(beside_gaps[1:])
    print(f"median inter-token gap: alone {1000 * alone:.2f} ms, beside 3 stalled streams {1000 * beside:.2f} ms")
    assert beside < 2 * alone, f"a reading stream's median gap went from {alone:.4f} s to {beside:.4f} s"
